#!/usr/bin/env bash
# Stop the single-host Slurm test cluster started by start.sh.
#
# Usage: stop.sh [-d STATE_DIR] [--purge]
#   -d STATE_DIR  the state dir given to start.sh
#                 (default $HPCBENCH_SLURM_DIR or /tmp/hpcbench-slurm)
#   --purge       also delete STATE_DIR (configs, logs, job state, database)
#
# Only processes that start.sh recorded in STATE_DIR/pids are stopped, after
# checking that each PID still is the same program (name and start time), plus
# the job steps running under our slurmds. Running jobs are cancelled first.
# A munged that was already running before start.sh is left alone.
# Safe to run twice, and when nothing is running.
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$HERE/common.sh"

STATE_DIR=$(default_state_dir)
PURGE=0
while (($#)); do
    case $1 in
        -d) STATE_DIR=${2:?-d needs a value}; shift 2 ;;
        --purge) PURGE=1; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
STATE_DIR=$(abs_path "$STATE_DIR")
[[ $STATE_DIR != / ]] || die "refusing to use / as state dir"
exec 1>&2

if [[ ! -d $STATE_DIR ]]; then
    log "nothing to stop: $STATE_DIR does not exist"
    exit 0
fi
for v in $(compgen -v SLURM_ || true); do unset "$v"; done

if [[ -d $STATE_DIR/pids ]]; then
    exec 9>"$STATE_DIR/.lock"
    flock -w 300 9 || die "another start.sh/stop.sh holds $STATE_DIR/.lock"
    stop_cluster
    exec 9>&-
fi
if (( PURGE )); then
    log "deleting $STATE_DIR"
    purge_state_dir
fi
log "stopped"
