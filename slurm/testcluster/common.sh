# Shared helpers for start.sh / stop.sh. Sourced, not executed.
# shellcheck shell=bash

log() { printf '[testcluster] %s\n' "$*" >&2; }
die() { printf '[testcluster] ERROR: %s\n' "$*" >&2; exit 1; }

default_state_dir() { printf '%s\n' "${HPCBENCH_SLURM_DIR:-/tmp/hpcbench-slurm}"; }

# Absolute, normalised path (the directory need not exist yet).
abs_path() { realpath -m -- "$1"; }

# Field 22 of /proc/PID/stat: process start time in clock ticks since boot.
# Together with the PID it identifies one process (PIDs get reused).
proc_starttime() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }          # drop "pid (comm) " - comm may contain spaces
    # shellcheck disable=SC2086
    set -- $stat               # now $1 is field 3 (state) ... field 22 is $20
    printf '%s\n' "${20}"
}

proc_comm() { cat "/proc/$1/comm" 2>/dev/null; }

# True if PID exists and is not a zombie.
proc_running() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat:0:1} != Z ]]
}

# record_pid LABEL PID: remember that we started PID (with its comm + start time).
record_pid() {
    local label=$1 pid=$2 comm st
    comm=$(proc_comm "$pid") || die "process $pid ($label) vanished right after start"
    st=$(proc_starttime "$pid") || die "process $pid ($label) vanished right after start"
    printf '%s %s %s\n' "$pid" "$comm" "$st" >"$STATE_DIR/pids/$label.pid"
}

# recorded_pid LABEL: print the PID if the recorded process is still that same
# process (same PID, same program name, same start time); fail otherwise.
recorded_pid() {
    local f="$STATE_DIR/pids/$1.pid" pid comm st
    [[ -r $f ]] || return 1
    read -r pid comm st <"$f" || return 1
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [[ "$(proc_comm "$pid")" == "$comm" ]] || return 1
    [[ "$(proc_starttime "$pid")" == "$st" ]] || return 1
    proc_running "$pid" || return 1       # a zombie counts as gone
    printf '%s\n' "$pid"
}

# All recorded labels (munged, mariadbd, slurmdbd, slurmctld, slurmd-cN).
recorded_labels() {
    local f
    for f in "$STATE_DIR"/pids/*.pid; do
        [[ -e $f ]] || continue
        f=${f##*/}
        printf '%s\n' "${f%.pid}"
    done
}

# Wait until the pid file FILE holds the PID of a live process; print the PID.
wait_pidfile() {
    local file=$1 timeout=$2 t=0 pid
    while (( t < timeout * 10 )); do
        if [[ -s $file ]]; then
            read -r pid <"$file" || true
            if [[ $pid =~ ^[0-9]+$ ]] && [[ -d /proc/$pid ]]; then
                printf '%s\n' "$pid"; return 0
            fi
        fi
        sleep 0.1; t=$((t + 1))
    done
    return 1
}

# All descendants of PID (children, grandchildren, ...), one per line.
descendants() {
    local parent=$1 child
    for child in $(ps -o pid= --ppid "$parent" 2>/dev/null); do
        printf '%s\n' "$child"
        descendants "$child"
    done
}

# Send TERM to the given PIDs, wait up to TIMEOUT s, then KILL what is left.
terminate_pids() {
    local timeout=$1; shift
    local pids=("$@") p alive t=0
    ((${#pids[@]})) || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    while (( t < timeout * 10 )); do
        alive=0
        for p in "${pids[@]}"; do
            # A zombie is as good as dead (its parent may not be us).
            if proc_running "$p"; then alive=1; break; fi
        done
        (( alive )) || return 0
        sleep 0.1; t=$((t + 1))
    done
    log "still alive after ${timeout}s, sending SIGKILL: ${pids[*]}"
    kill -KILL "${pids[@]}" 2>/dev/null || true
    sleep 0.2
}

# PIDs of live slurmstepd processes that belong to the cluster with config $1.
our_steps() {
    local pid
    for pid in $(pgrep -x slurmstepd || true); do
        proc_running "$pid" || continue
        if grep -qzxF "SLURM_CONF=$1" "/proc/$pid/environ" 2>/dev/null; then
            printf '%s\n' "$pid"
        fi
    done
    return 0
}

# Per-cluster directory in /dev/shm for Open MPI's shared-memory files.
shm_dir() { printf '/dev/shm/hpcbench-slurm-%s\n' "$(printf '%s' "$STATE_DIR" | md5sum | cut -c1-8)"; }

# The state dir of every other test cluster whose controller runs (found by the
# SLURM_CONF that start.sh gives it: STATE_DIR/etc/slurm.conf), one per line.
other_clusters() {
    local own=$1 pid conf
    for pid in $(pgrep -x slurmctld || true); do
        conf=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^SLURM_CONF=//p' | head -n1)
        [[ -n $conf && $conf != "$own" ]] || continue
        dirname -- "$(dirname -- "$conf")"
    done | sort -u
}

# hand_over_munge CONF: when another test cluster still runs, give it our record of
# munged (it reused ours) instead of stopping it under that cluster; true if handed over.
hand_over_munge() {
    local other
    recorded_pid munged >/dev/null || return 1
    other=$(other_clusters "$1" | head -n1)
    [[ -n $other && -d $other/pids ]] || return 1
    [[ -e $other/pids/munged.pid ]] || cp -- "$STATE_DIR/pids/munged.pid" "$other/pids/munged.pid"
    rm -f -- "$STATE_DIR/pids/munged.pid"
    log "munged left running for the test cluster of $other (which now stops it)"
}

# stop_cluster [keep_munge]: stop everything start.sh recorded in $STATE_DIR.
# Only processes recorded by start.sh (same PID, program name and start time)
# are signalled, plus the job steps (slurmstepd and their tasks) of our slurmds.
stop_cluster() {
    local keep_munge=${1:-} conf=$STATE_DIR/etc/slurm.conf l pid t
    local slurmds=() steps=()

    for l in $(recorded_labels); do
        if pid=$(recorded_pid "$l"); then
            case $l in
                slurmd-*) slurmds+=("$pid") ;;
            esac
        else
            rm -f "$STATE_DIR/pids/$l.pid"      # dead or not ours any more
        fi
    done

    # 1. Cancel jobs so that steps and user tasks end the normal way.
    if recorded_pid slurmctld >/dev/null && [[ -r $conf ]]; then
        local jobs
        jobs=$(SLURM_CONF=$conf timeout 10 squeue -h -o %F 2>/dev/null | sort -u || true)
        if [[ -n $jobs ]]; then
            log "cancelling jobs: ${jobs//$'\n'/ }"
            # shellcheck disable=SC2086
            SLURM_CONF=$conf timeout 10 scancel $jobs 2>/dev/null || true
            t=0
            while (( t < 100 )) && [[ -n "$(our_steps "$conf")" ]]; do   # up to 10 s
                sleep 0.1; t=$((t + 1))
            done
        fi
    fi

    # 2. slurmd, and the job steps that still run (slurmstepd is re-parented to
    # init, so find ours by the SLURM_CONF that slurmd passes on to it) together
    # with their tasks.
    for pid in $(our_steps "$conf"); do
        steps+=("$pid")
        mapfile -t -O "${#steps[@]}" steps < <(descendants "$pid")
    done
    if ((${#slurmds[@]} + ${#steps[@]})); then
        log "stopping ${#slurmds[@]} slurmd (+${#steps[@]} leftover job processes)"
        terminate_pids 15 "${slurmds[@]}" "${steps[@]}"
    fi

    # 3. Controller, accounting, database, munge - in that order (munge kept for
    # another test cluster that still runs on it).
    [[ -n $keep_munge ]] || ! hand_over_munge "$conf" || keep_munge=handed
    for l in slurmctld slurmdbd mariadbd munged; do
        [[ $l == munged && -n $keep_munge ]] && continue
        if pid=$(recorded_pid "$l"); then
            log "stopping $l (pid $pid)"
            terminate_pids 30 "$pid"
        fi
    done

    for l in $(recorded_labels); do
        [[ $l == munged && -n $keep_munge ]] && continue
        if recorded_pid "$l" >/dev/null; then
            log "WARNING: $l still running"
        else
            rm -f "$STATE_DIR/pids/$l.pid"
        fi
    done
    return 0
}

# Delete the state dir (only if start.sh made it) and our /dev/shm dir.
purge_state_dir() {
    rm -rf -- "$(shm_dir)"
    if [[ -e $STATE_DIR/.hpcbench-testcluster ]]; then
        rm -rf -- "$STATE_DIR"
    elif [[ -e $STATE_DIR ]]; then
        log "not deleting $STATE_DIR: it has no .hpcbench-testcluster marker"
    fi
}
