#!/usr/bin/env bash
# Build the environment hpcbench's ranks and tests run in, from nothing, idempotently:
#   - MPI and parallel HDF5: the site's (MPICC or mpicc/mpirun on PATH; HDF5_DIR, h5pcc or
#     pkg-config), else, as root where apt-get exists, Debian's Open MPI and parallel HDF5;
#   - a virtual environment with the pinned stack of envs/requirements-core.txt;
#   - h5py compiled against that parallel HDF5 ('mpio' driver). PyPI's h5py wheel has no
#     MPI, so we build it once and keep the wheel in a cache outside the clone
#     ($HPCBENCH_CACHE, default ~/.cache/hpcbench), keyed by everything it links against.
#     Without a parallel HDF5, PyPI's h5py: the ranks then write point files through one
#     writer (the gather writer), and the last line says so;
#   - $VENV/hpcbench-build.json: the MPI and HDF5 libraries it was built against, which
#     every rank compares with the ones it loads (hpcbench/rank/linkage.py).
# Nothing is written outside the environment and the cache (and temporary files), but for
# the apt step as root. The framework environments (TensorFlow, MXNet, Horovod) are built
# by envs/build.sh NAME; the functions both scripts use are in envs/lib.sh.
#
# Usage: envs/setup.sh [VENV_DIR]          (default: .venv at the repository root)
#   HPCBENCH_VENV          the environment when VENV_DIR is not given
#   HPCBENCH_REQUIREMENTS  the pinned requirements (default envs/requirements-core.txt);
#                          a subset of it sets up an environment without torch & co
#   HPCBENCH_CACHE         wheel cache (default ~/.cache/hpcbench)
#   HPCBENCH_APT=0         never apt-get install, even as root
#   MPICC, HDF5_DIR        the MPI compiler wrapper and the parallel HDF5 prefix to use
#   PYTHON                 the interpreter the environment is made from (default python3)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
# shellcheck source=envs/lib.sh
source "$here/lib.sh"

hb_tag=setup
hb_cache=${HPCBENCH_CACHE:-$HOME/.cache/hpcbench}
venv=${1:-${HPCBENCH_VENV:-$root/.venv}}
requirements=${HPCBENCH_REQUIREMENTS:-$here/requirements-core.txt}
h5py_version=3.14.0 # TensorFlow 2.21 needs h5py < 3.15
[[ -f $requirements ]] ||
    hb_die "HPCBENCH_REQUIREMENTS=$requirements is not a file (allowed: a pip requirements file, default $here/requirements-core.txt)"

hb_system_packages
hb_venv "$venv"
rm -f "$venv/hpcbench-build.json" # stale while this runs; written again at the end
py=$venv/bin/python
hb_pip "$py" -r "$requirements"
hb_h5py "$py" "$h5py_version"
# Editable as a path on sys.path ("compat"), not through an import hook: with the hook, a
# folder named hpcbench in the current directory (a clone in ~, the ranks started from ~)
# hides the package as an empty namespace package.
hb_pip "$py" --no-deps -e "$root" --config-settings editable_mode=compat
hb_build_record "$py" "$venv"
if [[ $hb_parallel_hdf5 == yes ]]; then
    hb_log "ready: $venv (parallel HDF5: yes)"
else
    hb_log "ready: $venv (parallel HDF5: no (gather writer))"
fi
