#!/usr/bin/env bash
# Build the environment hpcbench's ranks and tests run in, from nothing, idempotently:
#   - system packages: Open MPI and parallel HDF5 (apt, only what is missing);
#   - a virtual environment with the pinned stack of envs/requirements-core.txt;
#   - h5py compiled against parallel HDF5 ('mpio' driver). PyPI's h5py wheel has no MPI,
#     so we build it once and keep the wheel in a cache outside the clone
#     ($HPCBENCH_CACHE, default ~/.cache/hpcbench), keyed by everything it links against.
# The framework environments (TensorFlow, MXNet, Horovod) are built by envs/build.sh NAME;
# the functions both scripts use are in envs/lib.sh.
#
# Usage: envs/setup.sh [VENV_DIR]          (default: .venv at the repository root)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
# shellcheck source=envs/lib.sh
source "$here/lib.sh"

hb_tag=setup
hb_cache=${HPCBENCH_CACHE:-$HOME/.cache/hpcbench}
venv=${1:-${HPCBENCH_VENV:-$root/.venv}}
h5py_version=3.14.0 # TensorFlow 2.21 needs h5py < 3.15

hb_system_packages
hb_venv "$venv"
py=$venv/bin/python
hb_pip "$py" -r "$here/requirements-core.txt"
hb_h5py_mpi "$py" "$h5py_version"
hb_pip "$py" --no-deps -e "$root"
hb_log "ready: $venv (parallel HDF5: yes)"
