# Shell functions shared by envs/setup.sh (the core .venv) and envs/build.sh (the framework
# environments). Source it; it defines functions only. Each function is idempotent: it
# checks first and does the slow thing only when something is missing.
#
# Callers set: hb_tag (log prefix, e.g. "setup") and hb_cache (the build cache directory,
# $HPCBENCH_CACHE, default ~/.cache/hpcbench). Every cached artefact is a wheel in a folder
# named after everything it was compiled against, so a change of any of those builds anew
# instead of loading a binary built for something else.

hb_log() { printf '[%s] %s\n' "${hb_tag:-env}" "$*" >&2; }
hb_die() { hb_log "error: $*"; exit 1; }

# hb_apt_ensure PKG...: install the Debian packages that are missing (needs root for that).
hb_apt_ensure() {
    local p missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    if [[ $(id -u) -ne 0 ]]; then
        hb_die "missing system packages: ${missing[*]} (run as root, or install them first)"
    fi
    hb_log "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The system packages every environment compiles or runs against.
hb_system_packages() { hb_apt_ensure openmpi-bin libopenmpi-dev libhdf5-openmpi-dev pkg-config; }

# hb_venv DIR [PYTHON]: create a virtual environment at DIR unless it has an interpreter.
hb_venv() {
    local dir=$1 base=${2:-${PYTHON:-python3}}
    [[ -x $dir/bin/python ]] && return 0
    hb_log "creating $dir"
    "$base" -m venv "$dir"
}

# hb_pip PY ARGS...: quiet `pip install` into the interpreter PY.
hb_pip() {
    local py=$1
    shift
    "$py" -m pip install -q --disable-pip-version-check "$@"
}

# hb_pyver PY: "311" for CPython 3.11.
hb_pyver() { "$1" -c 'import sys; print("%d%d" % sys.version_info[:2])'; }

# hb_mpi_tag: the MPI implementation and version everything is linked against ("ompi4.1.4").
hb_mpi_tag() {
    local v
    v=$(mpirun --version 2>/dev/null | sed -n 's/.*(Open MPI) \([0-9][0-9.]*\).*/\1/p' | head -n 1)
    [[ -n $v ]] || hb_die "mpirun --version does not name an Open MPI version (is Open MPI installed?)"
    printf 'ompi%s' "$v"
}

# hb_cxx_tag: the C++ compiler's major version ("gcc12"): compiled extensions follow its ABI.
hb_cxx_tag() { printf 'gcc%s' "$(c++ -dumpversion | cut -d. -f1)"; }

# hb_h5py_mpi PY VERSION: make h5py VERSION in PY a build against parallel HDF5 (Open MPI).
# PyPI's h5py wheel has no MPI, so it is compiled once and the wheel is cached, keyed by
# python, HDF5 and mpi4py (h5py cimports mpi4py). A wheel compiled against numpy 2 also runs
# on numpy >= 1.21 (numpy 2's C API is backward compatible), so one wheel serves both the
# numpy 2 environments and numpy 1.23 (legacy); a build made in a numpy-1 environment (no
# numpy-2 wheel cached yet) only runs on numpy 1 and is kept under its own key ("-numpy1").
# PY needs numpy, mpi4py, Cython, pkgconfig and setuptools installed.
hb_h5py_mpi() {
    local py=$1 version=$2
    if "$py" -c 'import h5py, sys; sys.exit(0 if h5py.__version__ == sys.argv[1] and h5py.get_config().mpi else 1)' \
        "$version" 2>/dev/null; then
        return 0
    fi
    local hdf5_v np_major key wheels tmp
    hdf5_v=$(pkg-config --modversion hdf5-openmpi)
    np_major=$("$py" -c 'import numpy; print(numpy.__version__.split(".")[0])')
    key="py$(hb_pyver "$py")-hdf5-$hdf5_v-$("$py" -c 'import mpi4py; print("mpi4py" + mpi4py.__version__)')"
    wheels=$hb_cache/h5py-mpi/$key
    if [[ $np_major -lt 2 ]] && ! compgen -G "$wheels/h5py-$version-*.whl" >/dev/null; then
        wheels=$wheels-numpy$np_major
    fi
    if ! compgen -G "$wheels/h5py-$version-*.whl" >/dev/null; then
        hb_log "building h5py $version against parallel HDF5 $hdf5_v (a few minutes, cached in $wheels)"
        tmp=$(mktemp -d)
        HDF5_MPI=ON CC=mpicc HDF5_PKGCONFIG_NAME=hdf5-openmpi \
            "$py" -m pip wheel -q --disable-pip-version-check --no-deps --no-binary=h5py --no-build-isolation \
            -w "$tmp" "h5py==$version"
        mkdir -p "$wheels" && mv "$tmp"/h5py-*.whl "$wheels"/ && rmdir "$tmp"
    fi
    hb_pip "$py" --force-reinstall --no-deps "$wheels"/h5py-"$version"-*.whl
    "$py" -c 'import h5py, sys; sys.exit(0 if h5py.get_config().mpi else "h5py has no MPI support")'
}
