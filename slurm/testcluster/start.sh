#!/usr/bin/env bash
# Start a real Slurm cluster (slurmctld + slurmdbd/MariaDB + N slurmd) on this
# single host, with virtual nodes c1..cN that all live on 127.0.0.1.
#
#   eval "$(slurm/testcluster/start.sh -n 4)"    # prints: export SLURM_CONF=...
#
# Usage: start.sh [-n NODES] [-d STATE_DIR] [--fresh] [--netns PREFIX]
#   -n NODES      number of virtual nodes (default 4, or $HPCBENCH_SLURM_NODES)
#   -d STATE_DIR  where configs, logs, state, database and PIDs live
#                 (default $HPCBENCH_SLURM_DIR or /tmp/hpcbench-slurm)
#   --fresh       stop and wipe STATE_DIR first (job ids restart at 1!)
#   --netns PREFIX  node cI runs in the existing network namespace PREFIXI (made by
#                 hpcbench.testing.netlab): its slurmd is started there with nsenter,
#                 NodeAddr is the namespace's address, and slurmctld is reached on the
#                 namespaces' default gateway (the lab's bridge address). Job steps on cI
#                 then run in cI's namespace and ranks on different nodes talk TCP through
#                 the bridge. Without it every node is 127.0.0.1 in this namespace.
#
# Only the export line goes to stdout; everything else goes to stderr.
# Environment knobs (all optional):
#   HPCBENCH_SLURM_MAX_ARRAY_SIZE  slurm.conf MaxArraySize (Slurm default 1001)
#   HPCBENCH_SLURM_CPUS            CPUs per virtual node (default 2)
#   HPCBENCH_SLURM_REAL_MEMORY     RealMemory per node in MB (default 4000)
#   HPCBENCH_SLURM_PORT_BASE       ports: base+17 slurmctld, base+19 slurmdbd,
#                                  base+6 MariaDB, base+101.. slurmd (default 16800)
#   HPCBENCH_SLURM_TIMEOUT         seconds to wait for each daemon (default 60)
#   HPCBENCH_SLURM_RETURN_TO_SERVICE  slurm.conf ReturnToService (default 1)
#   HPCBENCH_SLURM_EXTRA_CONF      extra lines appended to slurm.conf
#   HPCBENCH_SLURM_KEEP_ON_FAILURE=1  on failure leave daemons running (debugging)
#
# Needs root (it runs the daemons as root and may apt-get install packages).
# No systemd needed. Stop with slurm/testcluster/stop.sh [-d STATE_DIR] [--purge].
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$HERE/common.sh"

NODES=${HPCBENCH_SLURM_NODES:-4}
STATE_DIR=$(default_state_dir)
FRESH=0
NETNS=
while (($#)); do
    case $1 in
        -n) NODES=${2:?-n needs a value}; shift 2 ;;
        -d) STATE_DIR=${2:?-d needs a value}; shift 2 ;;
        --fresh) FRESH=1; shift ;;
        --netns) NETNS=${2:?--netns needs a namespace prefix}; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
[[ $NODES =~ ^[1-9][0-9]*$ ]] || die "-n must be a positive integer, got '$NODES'"
(( NODES <= 64 )) || die "-n $NODES is too many virtual nodes for one host (max 64)"
STATE_DIR=$(abs_path "$STATE_DIR")
[[ $STATE_DIR != / ]] || die "refusing to use / as state dir"
(( EUID == 0 )) || die "must run as root (daemons run as root; packages may be installed)"

# Node addresses: 127.0.0.1, or each node's address in its namespace (--netns).
CTLD_ADDR=127.0.0.1
NODE_ADDRS=()
if [[ -n $NETNS ]]; then
    [[ $NETNS =~ ^[a-z][a-z0-9]*$ ]] || die "--netns must be a namespace prefix (letters, digits), got '$NETNS'"
    for ((i = 1; i <= NODES; i++)); do
        [[ -e /run/netns/$NETNS$i ]] || die "--netns $NETNS: namespace $NETNS$i does not exist (make the lab first)"
        addr=$(ip -n "$NETNS$i" -4 -o addr show scope global | awk '{ sub(/\/.*/, "", $4); print $4; exit }')
        [[ -n $addr ]] || die "--netns $NETNS: namespace $NETNS$i has no IPv4 address"
        gw=$(ip -n "$NETNS$i" -4 route show default | awk '{ print $3; exit }')
        [[ -n $gw ]] || die "--netns $NETNS: namespace $NETNS$i has no default route (to the bridge)"
        NODE_ADDRS+=("$addr")
        CTLD_ADDR=$gw
    done
fi

# fd 3 = the caller's stdout (only the final export line goes there);
# everything else, including output of the tools we run, goes to stderr.
exec 3>&1 1>&2

# Don't let a surrounding Slurm job / user setting leak into our client calls.
for v in $(compgen -v SLURM_ || true); do unset "$v"; done

CPUS=${HPCBENCH_SLURM_CPUS:-2}
REAL_MEMORY=${HPCBENCH_SLURM_REAL_MEMORY:-4000}
PORT_BASE=${HPCBENCH_SLURM_PORT_BASE:-16800}
TIMEOUT=${HPCBENCH_SLURM_TIMEOUT:-60}
MAX_ARRAY_SIZE=${HPCBENCH_SLURM_MAX_ARRAY_SIZE:-}
for v in CPUS REAL_MEMORY PORT_BASE TIMEOUT; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be an integer, got '${!v}'"
done
[[ -z $MAX_ARRAY_SIZE || $MAX_ARRAY_SIZE =~ ^[0-9]+$ ]] \
    || die "HPCBENCH_SLURM_MAX_ARRAY_SIZE must be an integer, got '$MAX_ARRAY_SIZE'"
CTLD_PORT=$((PORT_BASE + 17))
DBD_PORT=$((PORT_BASE + 19))
DB_PORT=$((PORT_BASE + 6))
SLURMD_PORT0=$((PORT_BASE + 101))
HOST=$(hostname -s)
CLUSTER=hpcbench

ETC=$STATE_DIR/etc
LOGDIR=$STATE_DIR/log
RUN=$STATE_DIR/run
CONF=$ETC/slurm.conf
DB_DATA=$STATE_DIR/mariadb
DB_SOCK=$RUN/mariadb.sock
# Open MPI shared-memory backing files, one dir per virtual node (see TaskProlog).
SHM_DIR=$(shm_dir)
export SLURM_CONF=$CONF

T0=$EPOCHREALTIME
elapsed() { awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

# --------------------------------------------------------------- packages ---
# Component packages of slurm-wlm plus accounting (slurmdbd + MariaDB) and munge.
PKGS=(slurmctld slurmd slurm-client slurm-wlm-basic-plugins slurmdbd munge mariadb-server mariadb-client)
missing=()
for p in "${PKGS[@]}"; do
    if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]]; then
        missing+=("$p")
    fi
done
mkdir -p "$LOGDIR"
if ((${#missing[@]})); then
    log "installing missing packages: ${missing[*]} (log: $LOGDIR/apt.log)"
    # Package scripts may try to start services (e.g. a system MariaDB or munged
    # where no policy-rc.d forbids it); keep our fds away from them so a caller
    # capturing our output never hangs.
    {
        apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            -o DPkg::Lock::Timeout=300 -o Dpkg::Options::=--force-confdef \
            -o Dpkg::Options::=--force-confold "${missing[@]}"
    } </dev/null >"$LOGDIR/apt.log" 2>&1 3>&- \
        || { tail -n 20 "$LOGDIR/apt.log" >&2; die "apt-get install failed, see $LOGDIR/apt.log"; }
fi

# ------------------------------------------------------------------- lock ---
mkdir -p "$STATE_DIR"
touch "$STATE_DIR/.hpcbench-testcluster"   # marker: stop.sh --purge only deletes dirs with it
exec 9>"$STATE_DIR/.lock"
flock -w 300 9 || die "another start.sh/stop.sh holds $STATE_DIR/.lock"

if (( FRESH )); then
    log "--fresh: stopping and wiping $STATE_DIR"
    stop_cluster
    purge_state_dir
    mkdir -p "$STATE_DIR"
    touch "$STATE_DIR/.hpcbench-testcluster"
fi
mkdir -p "$ETC" "$LOGDIR" "$RUN" "$STATE_DIR/pids" "$STATE_DIR/ctld-state" \
         "$STATE_DIR/spool" "$STATE_DIR/tmp"
chmod 755 "$STATE_DIR"

# ---------------------------------------------------------------- configs ---
if [[ -s $ETC/dbpass ]]; then DB_PASS=$(cat "$ETC/dbpass"); else
    DB_PASS=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
    (umask 077; printf '%s\n' "$DB_PASS" >"$ETC/dbpass")
fi

if (( NODES == 1 )); then NODELIST=c1; PORTS=$SLURMD_PORT0
else NODELIST="c[1-$NODES]"; PORTS="$SLURMD_PORT0-$((SLURMD_PORT0 + NODES - 1))"; fi

node_lines() {
    local i
    if [[ -z $NETNS ]]; then
        printf 'NodeName=%s NodeHostname=%s NodeAddr=127.0.0.1 Port=%s\n' "$NODELIST" "$HOST" "$PORTS"
        return
    fi
    for ((i = 1; i <= NODES; i++)); do
        printf 'NodeName=c%s NodeHostname=%s NodeAddr=%s Port=%s\n' \
            "$i" "$HOST" "${NODE_ADDRS[i - 1]}" "$((SLURMD_PORT0 + i - 1))"
    done
}

write_configs() {   # write into directory $1
    local d=$1
    cat >"$d/slurm.conf" <<EOF
# Generated by slurm/testcluster/start.sh - do not edit (rewritten on start).
ClusterName=$CLUSTER
SlurmctldHost=$HOST($CTLD_ADDR)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# Per-node paths must contain %n: all slurmds share this host.
StateSaveLocation=$STATE_DIR/ctld-state
SlurmdSpoolDir=$STATE_DIR/spool/%n
TmpFS=$STATE_DIR/tmp/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$ETC/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TaskProlog=$ETC/task_prolog.sh
SwitchType=switch/none
MpiDefault=pmix
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$HOST
AccountingStoragePort=$DBD_PORT
JobCompType=jobcomp/none
KillOnBadExit=1
# 1: a node that went DOWN for not responding comes back when its slurmd
# registers; one set DOWN by hand stays DOWN until "state=resume" (with 2 it
# would return by itself within about a minute, which breaks node-failure tests).
ReturnToService=${HPCBENCH_SLURM_RETURN_TO_SERVICE:-1}
JobRequeue=1
InactiveLimit=0
KillWait=5
MinJobAge=300
Waittime=0
MailProg=/bin/true
${MAX_ARRAY_SIZE:+MaxArraySize=$MAX_ARRAY_SIZE}
NodeName=DEFAULT CPUs=$CPUS RealMemory=$REAL_MEMORY State=UNKNOWN
$(node_lines)
PartitionName=debug Nodes=$NODELIST Default=YES MaxTime=INFINITE State=UP
${HPCBENCH_SLURM_EXTRA_CONF:-}
EOF
    cat >"$d/slurmdbd.conf" <<EOF
# Generated by slurm/testcluster/start.sh - do not edit (rewritten on start).
AuthType=auth/munge
DbdHost=$HOST
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
DebugLevel=info
LogFile=$LOGDIR/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$d/slurmdbd.conf"   # slurmdbd insists (it holds the DB password)
    # Empty plugstack: do not pick up /etc/slurm/plugstack.conf.d/* of the host.
    : >"$d/plugstack.conf"
    # Ranks of one job on different virtual nodes share /dev/shm and collide in
    # Open MPI's vader (shared memory) BTL files: give each node its own dir.
    cat >"$d/task_prolog.sh" <<EOF
#!/bin/sh
# Generated by slurm/testcluster/start.sh. Output lines "export K=V" set task env.
# Not for the batch step (no SLURM_STEP_ID): an mpirun there would forward the
# variable to its orteds on the other virtual nodes, which then collide again.
# mpirun's orteds are srun tasks, so they (and their ranks) get their own node's
# dir, and mpirun's local ranks use plain /dev/shm.
[ -n "\${SLURM_STEP_ID:-}" ] || exit 0
d="$SHM_DIR/\${SLURMD_NODENAME:-unknown}"
mkdir -p "\$d" 2>/dev/null
echo "export OMPI_MCA_btl_vader_backing_directory=\$d"
EOF
    chmod 755 "$d/task_prolog.sh"
    printf '%s %s\n' "$NODES" "$NETNS" >"$d/nodes"
}

NEW=$ETC/.new
rm -rf "$NEW"; mkdir -p "$NEW"
write_configs "$NEW"
same_configs() {
    local f
    for f in slurm.conf slurmdbd.conf task_prolog.sh nodes; do
        cmp -s "$NEW/$f" "$ETC/$f" || return 1
    done
}

all_recorded_alive() {
    local l n=0
    for l in mariadbd slurmdbd slurmctld; do recorded_pid "$l" >/dev/null || return 1; done
    for ((i = 1; i <= NODES; i++)); do recorded_pid "slurmd-c$i" >/dev/null || return 1; done
    for l in $(recorded_labels); do [[ $l == slurmd-* ]] && n=$((n + 1)); done
    (( n == NODES ))
}

# ------------------------------------------------------- already running? ---
REUSE=0
if all_recorded_alive && same_configs && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "cluster in $STATE_DIR is already running with the same configuration; reusing it"
    REUSE=1
else
    any=0
    for l in $(recorded_labels); do
        [[ $l == munged ]] && continue
        if recorded_pid "$l" >/dev/null; then any=1; fi
    done
    if (( any )); then
        log "stopping the previous cluster in $STATE_DIR (configuration or node count changed, or partly dead)"
        stop_cluster keep_munge
    fi
    for f in slurm.conf slurmdbd.conf plugstack.conf task_prolog.sh nodes; do
        mv -f "$NEW/$f" "$ETC/$f"
    done
fi
rm -rf "$NEW"

# On failure: say which log to read, then stop whatever we started (logs stay).
CURRENT_LOG=$LOGDIR
on_exit() {
    local rc=$?
    if (( rc != 0 )) && (( REUSE == 0 )); then
        log "start failed (exit $rc); relevant log: $CURRENT_LOG"
        if [[ -f $CURRENT_LOG ]]; then
            log "---- last lines of $CURRENT_LOG ----"
            tail -n 25 "$CURRENT_LOG" >&2 || true
            log "-------------------------------------"
        fi
        if [[ ${HPCBENCH_SLURM_KEEP_ON_FAILURE:-0} == 1 ]]; then
            log "HPCBENCH_SLURM_KEEP_ON_FAILURE=1: leaving the daemons running; stop them with stop.sh"
        else
            log "stopping what was started (logs are kept in $LOGDIR)"
            stop_cluster || true
        fi
    fi
}
trap on_exit EXIT

# Start a daemon detached from us: clean environment, no inherited fds (a caller
# doing $(start.sh) or subprocess.run(capture_output=True) must not hang), cwd /.
spawn() {
    local logfile=$1; shift
    ( cd / && exec setsid env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
        HOME=/root SLURM_CONF="$CONF" "$@" </dev/null >>"$logfile" 2>&1 3>&- 9>&- ) &
}

port_free() { ! (exec 2>/dev/null; : <"/dev/tcp/127.0.0.1/$1"); }
check_port() { port_free "$1" || die "port $1 ($2) on 127.0.0.1 is already in use; set HPCBENCH_SLURM_PORT_BASE to another value"; }

wait_until() {  # wait_until TIMEOUT DESCRIPTION COMMAND...
    local timeout=$1 what=$2 t=0 out; shift 2
    until out=$("$@" 2>&1); do
        if (( t >= timeout * 5 )); then
            [[ -z $out ]] || log "last output of '$*': $(tail -n 5 <<<"$out")"
            die "timed out after ${timeout}s waiting for $what; read $CURRENT_LOG"
        fi
        sleep 0.2; t=$((t + 1))
    done
}

if (( REUSE == 0 )); then
    # Fail early (before starting anything) when a port we need is taken.
    CURRENT_LOG="(none: a port is taken)"
    check_port "$DB_PORT" MariaDB
    check_port "$DBD_PORT" slurmdbd
    check_port "$CTLD_PORT" slurmctld
    for ((i = 1; i <= NODES; i++)); do check_port "$((SLURMD_PORT0 + i - 1))" "slurmd c$i"; done

    # ---------------------------------------------------------------- munge ---
    CURRENT_LOG=/var/log/munge/munged.log
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        # Running already: ours from an earlier start (keep the record) or not ours.
        recorded_pid munged >/dev/null || rm -f "$STATE_DIR/pids/munged.pid"
    else
        rm -f "$STATE_DIR/pids/munged.pid"
        # munged only reads its key from /etc/munge (the Debian package normally
        # creates it); create one if it is missing.
        if [[ ! -s /etc/munge/munge.key ]]; then
            log "creating /etc/munge/munge.key"
            install -d -o munge -g munge -m 0700 /etc/munge
            if command -v mungekey >/dev/null; then
                runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
            else
                dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
            fi
            chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key
        fi
        install -d -o munge -g munge -m 0755 /run/munge
        install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
        rm -f /run/munge/munged.pid
        log "starting munged"
        spawn "$LOGDIR/munged.out" runuser -u munge -- /usr/sbin/munged
        pid=$(wait_pidfile /run/munge/munged.pid "$TIMEOUT") || die "munged did not start; read /var/log/munge/munged.log"
        record_pid munged "$pid"
        wait_until "$TIMEOUT" "munge to answer (munge -n | unmunge)" \
            bash -c 'munge -n | unmunge'
    fi

    # -------------------------------------------------------------- MariaDB ---
    CURRENT_LOG=$LOGDIR/mariadb.log
    if [[ ! -d $DB_DATA/mysql ]]; then
        log "initialising MariaDB data dir $DB_DATA"
        rm -rf "$DB_DATA"; mkdir -p "$DB_DATA"
        mariadb-install-db --no-defaults --user=root --datadir="$DB_DATA" \
            --auth-root-authentication-method=socket --skip-test-db \
            </dev/null >"$LOGDIR/mariadb-install.log" 2>&1 3>&- 9>&- \
            || { CURRENT_LOG=$LOGDIR/mariadb-install.log; die "mariadb-install-db failed"; }
    fi
    rm -f "$RUN/mariadb.pid" "$DB_SOCK"
    log "starting MariaDB on 127.0.0.1:$DB_PORT (own datadir and socket)"
    spawn "$LOGDIR/mariadb.log" /usr/sbin/mariadbd --no-defaults --user=root \
        --datadir="$DB_DATA" --socket="$DB_SOCK" --port="$DB_PORT" \
        --bind-address=127.0.0.1 --skip-name-resolve --pid-file="$RUN/mariadb.pid" \
        --log-error="$LOGDIR/mariadb.log" --innodb-buffer-pool-size=64M \
        --innodb-log-file-size=16M --innodb-lock-wait-timeout=900 --max-connections=200
    pid=$(wait_pidfile "$RUN/mariadb.pid" "$TIMEOUT") || die "MariaDB did not start"
    record_pid mariadbd "$pid"
    # shellcheck disable=SC2120
    mysql_root() { mariadb --no-defaults --socket="$DB_SOCK" -uroot "$@"; }
    wait_until "$TIMEOUT" "MariaDB to answer" mysql_root -e 'SELECT 1'
    # shellcheck disable=SC2119
    mysql_root <<EOF
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
EOF

    # ------------------------------------------------------------- slurmdbd ---
    CURRENT_LOG=$LOGDIR/slurmdbd.log
    rm -f "$RUN/slurmdbd.pid"
    log "starting slurmdbd on port $DBD_PORT"
    spawn "$LOGDIR/slurmdbd.out" /usr/sbin/slurmdbd
    pid=$(wait_pidfile "$RUN/slurmdbd.pid" "$TIMEOUT") || die "slurmdbd did not start"
    record_pid slurmdbd "$pid"
    # slurmctld must only start once slurmdbd answers, else it dies ("no TRES").
    wait_until "$TIMEOUT" "slurmdbd to answer (sacctmgr show cluster)" \
        sacctmgr -n -P show cluster format=cluster
    clusters=$(sacctmgr -n -P show cluster format=cluster)
    if ! grep -qx "$CLUSTER" <<<"$clusters"; then
        log "registering cluster '$CLUSTER' in slurmdbd"
        sacctmgr -i add cluster "$CLUSTER" >/dev/null
    fi

    # ------------------------------------------------------------ slurmctld ---
    CURRENT_LOG=$LOGDIR/slurmctld.log
    rm -f "$RUN/slurmctld.pid"
    log "starting slurmctld on port $CTLD_PORT"
    spawn "$LOGDIR/slurmctld.out" /usr/sbin/slurmctld -f "$CONF"
    pid=$(wait_pidfile "$RUN/slurmctld.pid" "$TIMEOUT") || die "slurmctld did not start"
    record_pid slurmctld "$pid"
    ctld_up() { local o; o=$(scontrol ping) && [[ $o == *"is UP"* ]]; }
    wait_until "$TIMEOUT" "slurmctld to answer (scontrol ping)" ctld_up

    # --------------------------------------------------------------- slurmd ---
    for ((i = 1; i <= NODES; i++)); do
        mkdir -p "$STATE_DIR/spool/c$i" "$STATE_DIR/tmp/c$i"
        rm -f "$RUN/slurmd-c$i.pid"
    done
    log "starting $NODES slurmd (c1..c$NODES, ports $PORTS)"
    for ((i = 1; i <= NODES; i++)); do
        # In a namespace: nsenter, not `ip netns exec` (which remounts /sys, and slurmd
        # then finds no cgroup filesystem).
        in_ns=()
        [[ -z $NETNS ]] || in_ns=(nsenter "--net=/run/netns/$NETNS$i" --)
        spawn "$LOGDIR/slurmd-c$i.out" "${in_ns[@]}" /usr/sbin/slurmd -f "$CONF" -N "c$i"
    done
    for ((i = 1; i <= NODES; i++)); do
        CURRENT_LOG=$LOGDIR/slurmd-c$i.log
        pid=$(wait_pidfile "$RUN/slurmd-c$i.pid" "$TIMEOUT") || die "slurmd c$i did not start"
        record_pid "slurmd-c$i" "$pid"
    done
fi

# ------------------------------------------------------------ readiness ---
CURRENT_LOG="$LOGDIR/slurmctld.log and $LOGDIR/slurmd-c*.log"
resumed=" "
t=0
while :; do
    idle=0
    while read -r node state; do
        case $state in
            # usable and responding ("*" = not responding); busy only on reuse
            idle|mixed|allocated|completing) idle=$((idle + 1)) ;;
            down*|drain*|fail*)
                # Left down/drained in the saved controller state: bring it back once.
                if [[ $resumed != *" $node "* ]]; then
                    scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
                    resumed+="$node "
                fi ;;
        esac
    done < <(sinfo -h -N -o '%N %T' 2>/dev/null || true)
    (( idle == NODES )) && break   # "idle" counts all usable nodes
    if (( t >= TIMEOUT * 5 )); then
        sinfo -N >&2 || true
        die "timed out after ${TIMEOUT}s waiting for $NODES idle nodes; read $CURRENT_LOG"
    fi
    sleep 0.2; t=$((t + 1))
done
CURRENT_LOG=$LOGDIR/slurmdbd.log
wait_until "$TIMEOUT" "sacct to answer" sacct -n -X -S now
log "cluster '$CLUSTER' up: $NODES nodes idle, sacct answers ($(elapsed)s); logs in $LOGDIR"
trap - EXIT
printf 'export SLURM_CONF=%q\n' "$CONF" >&3
