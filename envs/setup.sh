#!/usr/bin/env bash
# Build the environment hpcbench's ranks and tests run in, from nothing, idempotently:
#   - system packages: Open MPI and parallel HDF5 (apt, only what is missing);
#   - a virtual environment with the pinned stack of envs/requirements-core.txt;
#   - h5py compiled against parallel HDF5 ('mpio' driver). PyPI's h5py wheel has no MPI,
#     so we build it once and keep the wheel in a cache outside the clone
#     ($HPCBENCH_CACHE, default ~/.cache/hpcbench), keyed by everything it links against.
#
# Usage: envs/setup.sh [VENV_DIR]          (default: .venv at the repository root)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
venv=${1:-${HPCBENCH_VENV:-$root/.venv}}
cache=${HPCBENCH_CACHE:-$HOME/.cache/hpcbench}
python=${PYTHON:-python3}
h5py_version=3.14.0   # TensorFlow 2.21 needs h5py < 3.15

log() { printf '[setup] %s\n' "$*" >&2; }

# --- system packages --------------------------------------------------------------------
apt_pkgs=(openmpi-bin libopenmpi-dev libhdf5-openmpi-dev pkg-config)
missing=()
for p in "${apt_pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        log "missing system packages: ${missing[*]} (run as root, or install them first)"; exit 1
    fi
    log "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- virtual environment ----------------------------------------------------------------
if [[ ! -x $venv/bin/python ]]; then
    log "creating $venv"
    "$python" -m venv "$venv"
fi
py=$venv/bin/python
pip() { "$py" -m pip install -q --disable-pip-version-check "$@"; }
pip -r "$here/requirements-core.txt"

# --- parallel h5py (cached wheel) -------------------------------------------------------
if ! "$py" -c 'import h5py, sys; sys.exit(0 if h5py.get_config().mpi else 1)' 2>/dev/null; then
    hdf5_v=$(pkg-config --modversion hdf5-openmpi)
    key="py$("$py" -c 'import sys; print("%d%d" % sys.version_info[:2])')-hdf5-$hdf5_v-$("$py" -c 'import mpi4py; print("mpi4py" + mpi4py.__version__)')"
    wheels=$cache/h5py-mpi/$key
    if ! compgen -G "$wheels/h5py-$h5py_version-*.whl" >/dev/null; then
        log "building h5py $h5py_version against parallel HDF5 $hdf5_v (a few minutes, cached in $wheels)"
        tmp=$(mktemp -d)
        HDF5_MPI=ON CC=mpicc HDF5_PKGCONFIG_NAME=hdf5-openmpi \
            "$py" -m pip wheel -q --no-deps --no-binary=h5py --no-build-isolation \
            -w "$tmp" "h5py==$h5py_version"
        mkdir -p "$wheels" && mv "$tmp"/h5py-*.whl "$wheels"/ && rmdir "$tmp"
    fi
    pip --force-reinstall --no-deps "$wheels"/h5py-"$h5py_version"-*.whl
fi
"$py" -c 'import h5py, sys; sys.exit(0 if h5py.get_config().mpi else "h5py has no MPI support")'

# --- hpcbench itself --------------------------------------------------------------------
pip --no-deps -e "$root"
log "ready: $venv (parallel HDF5: yes)"
