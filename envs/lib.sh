# Shell functions shared by envs/setup.sh (the core .venv) and envs/build.sh (the framework
# environments). Source it; it defines functions only. Each function is idempotent: it
# checks first and does the slow thing only when something is missing.
#
# Callers set: hb_tag (log prefix, e.g. "setup") and hb_cache (the build cache directory,
# $HPCBENCH_CACHE, default ~/.cache/hpcbench). Every cached artefact is a wheel in a folder
# named after everything it was compiled against, so a change of any of those builds anew
# instead of loading a binary built for something else.
#
# MPI and parallel HDF5 are taken from what the site provides (modules, Spack, a vendor
# MPI, the system) before any package manager: see hb_system_packages.

hb_log() { printf '[%s] %s\n' "${hb_tag:-env}" "$*" >&2; }
hb_die() { hb_log "error: $*"; exit 1; }

# hb_hash TEXT...: a short digest, for cache keys.
hb_hash() { printf '%s\n' "$@" | sha256sum | cut -c1-8; }

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

# --- MPI ----------------------------------------------------------------------------------
# hb_find_mpi: sets hb_mpicc (the MPI C compiler wrapper: $MPICC, else mpicc on PATH) and
# hb_mpirun (mpirun or mpiexec on PATH, else beside hb_mpicc); either may be empty.
hb_find_mpi() {
    hb_mpicc='' hb_mpirun=''
    if [[ -n ${MPICC:-} ]]; then
        hb_mpicc=$(command -v "$MPICC") ||
            hb_die "MPICC=$MPICC is not an executable (allowed: the path or command name of an MPI C compiler wrapper)"
    else
        hb_mpicc=$(command -v mpicc) || hb_mpicc=''
    fi
    hb_mpirun=$(command -v mpirun || command -v mpiexec) || hb_mpirun=''
    local name
    for name in mpirun mpiexec; do
        [[ -z $hb_mpirun && -n $hb_mpicc && -x $(dirname "$hb_mpicc")/$name ]] && hb_mpirun=$(dirname "$hb_mpicc")/$name
    done
    return 0
}

# hb_mpi_tag: the MPI implementation and version everything is linked against ("ompi4.1.4",
# "mpich4.1.2", "impi2021.10"); an MPI that does not say: "mpi-" and a digest of its paths.
hb_mpi_tag() {
    local text v
    text=$("${hb_mpirun:-mpirun}" --version 2>&1 | head -n 20) || true
    v=$(sed -n 's/.*(Open MPI) \([0-9][0-9.]*\).*/\1/p' <<<"$text" | head -n 1)
    [[ -n $v ]] && { printf 'ompi%s' "$v"; return 0; }
    v=$(sed -n 's/.*Intel(R) MPI Library.*Version \([0-9][0-9.]*\).*/\1/p' <<<"$text" | head -n 1)
    [[ -n $v ]] && { printf 'impi%s' "$v"; return 0; }
    v=$(sed -n 's/^ *Version: *\([0-9][0-9.a-z]*\).*/\1/p' <<<"$text" | head -n 1) # MPICH's Hydra
    [[ -n $v ]] && { printf 'mpich%s' "$v"; return 0; }
    printf 'mpi-%s' "$(hb_hash "$(realpath "${hb_mpicc:-$hb_mpirun}" 2>/dev/null)")"
}

# hb_mpi_id: hb_mpi_tag and a digest of where that MPI is (its wrapper, resolved, and the
# flags it compiles with), so that two installations of one version key apart.
hb_mpi_id() {
    local show=''
    [[ -n $hb_mpicc ]] && show=$("$hb_mpicc" -show 2>/dev/null || true)
    printf '%s-%s' "$(hb_mpi_tag)" "$(hb_hash "$(realpath "${hb_mpicc:-$hb_mpirun}")" "$show")"
}

# hb_cxx_tag: the C++ compiler's major version ("gcc12"): compiled extensions follow its ABI.
hb_cxx_tag() { printf 'gcc%s' "$(c++ -dumpversion | cut -d. -f1)"; }

# --- parallel HDF5 ------------------------------------------------------------------------
# _hb_hdf5_at INCLUDE_DIR LIB_DIR SOURCE: take the HDF5 whose headers are in INCLUDE_DIR
# and shared library in LIB_DIR if it is a parallel build (H5_HAVE_PARALLEL in H5pubconf.h).
_hb_hdf5_at() {
    local inc=$1 lib=$2 source=$3 conf=$1/H5pubconf.h
    [[ -f $conf && -e $lib/libhdf5.so ]] || return 1
    if ! grep -Eq '^#define H5_HAVE_PARALLEL 1' "$conf"; then
        hb_hdf5_serial+=("$source: $inc is a serial build")
        return 1
    fi
    hb_hdf5_inc=$(realpath "$inc") hb_hdf5_lib=$(realpath "$lib") hb_hdf5_source=$source
    hb_hdf5_version=$(sed -n 's/^#define H5_VERSION "\([^"]*\)".*/\1/p' "$conf")
}

# _hb_hdf5_dirs SOURCE FLAGS...: try every -I directory of FLAGS with every -L directory
# (and the folder of every library file named in FLAGS).
_hb_hdf5_dirs() {
    local source=$1 flag inc lib incs=() libs=()
    shift
    for flag in "$@"; do
        case $flag in
        -I*) incs+=("${flag#-I}") ;;
        -L*) libs+=("${flag#-L}") ;;
        /*/libhdf5.* | /*/libhdf5_*) libs+=("$(dirname "$flag")") ;;
        esac
    done
    for inc in "${incs[@]}"; do
        for lib in "${libs[@]}"; do
            _hb_hdf5_at "$inc" "$lib" "$source" && return 0
        done
    done
    return 1
}

# hb_find_hdf5: sets hb_parallel_hdf5 (yes | no) and, for yes, hb_hdf5_inc, hb_hdf5_lib
# (resolved), hb_hdf5_version and hb_hdf5_source (where it was found). Looks, in order, at
# $HDF5_DIR, h5pcc on PATH, and pkg-config's hdf5-openmpi, hdf5-mpich and hdf5.
hb_find_hdf5() {
    hb_parallel_hdf5=no hb_hdf5_inc='' hb_hdf5_lib='' hb_hdf5_version='' hb_hdf5_source='' hb_hdf5_serial=()
    local lib name point
    if [[ -n ${HDF5_DIR:-} ]]; then
        lib=$HDF5_DIR/lib
        [[ -e $HDF5_DIR/lib64/libhdf5.so ]] && lib=$HDF5_DIR/lib64
        [[ -f $HDF5_DIR/include/H5pubconf.h && -e $lib/libhdf5.so ]] ||
            hb_die "HDF5_DIR=$HDF5_DIR holds no HDF5 (expected include/H5pubconf.h and lib/libhdf5.so or lib64/libhdf5.so): point it at an HDF5 installation prefix, or unset it"
        _hb_hdf5_at "$HDF5_DIR/include" "$lib" "HDF5_DIR" ||
            hb_die "HDF5_DIR=$HDF5_DIR is a serial HDF5 (no H5_HAVE_PARALLEL in its H5pubconf.h): point it at a parallel build, or unset it (then point files are written by the gather writer)"
    elif command -v h5pcc >/dev/null; then
        # shellcheck disable=SC2046 # the flags are words
        if ! _hb_hdf5_dirs "h5pcc $(command -v h5pcc)" $(h5pcc -show 2>/dev/null); then
            point=$(h5pcc -showconfig 2>/dev/null | sed -n 's/^ *Installation point: *//p' | head -n 1)
            [[ -n $point ]] && _hb_hdf5_at "$point/include" "$point/lib" "h5pcc $(command -v h5pcc)" || true
        fi
    fi
    if [[ -z $hb_hdf5_inc ]] && command -v pkg-config >/dev/null; then
        for name in hdf5-openmpi hdf5-mpich hdf5; do
            pkg-config --exists "$name" 2>/dev/null || continue
            # shellcheck disable=SC2046 # the flags are words
            _hb_hdf5_dirs "pkg-config $name" $(pkg-config --cflags-only-I --libs-only-L "$name") && break
        done
    fi
    [[ -n $hb_hdf5_inc ]] && hb_parallel_hdf5=yes
    return 0
}

# hb_system_packages: find the MPI and the parallel HDF5 the site provides (hb_find_mpi,
# hb_find_hdf5); only when something is missing, apt-get exists, we are root and
# HPCBENCH_APT is not 0, install Debian's Open MPI and parallel HDF5 and look again.
# No MPI at all is an error; no parallel HDF5 is not (hb_parallel_hdf5=no: h5py from PyPI,
# and the ranks write point files with the gather writer).
hb_system_packages() {
    hb_find_mpi
    hb_find_hdf5
    if [[ -z $hb_mpicc || -z $hb_mpirun || $hb_parallel_hdf5 != yes ]] && [[ $(id -u) -eq 0 && ${HPCBENCH_APT:-1} != 0 ]] &&
        command -v apt-get >/dev/null && command -v dpkg-query >/dev/null; then
        hb_apt_ensure openmpi-bin libopenmpi-dev libhdf5-openmpi-dev pkg-config
        hb_find_mpi
        hb_find_hdf5
    fi
    if [[ -z $hb_mpicc && -z $hb_mpirun ]]; then
        hb_die "no MPI found (MPICC is not set; no mpicc, mpirun or mpiexec on PATH): load your site's MPI (module load openmpi, spack load openmpi), set MPICC to its compiler wrapper (e.g. MPICC=/opt/mpi/bin/mpicc), or run this as root on Debian/Ubuntu to apt-get install openmpi-bin libopenmpi-dev"
    fi
    hb_log "MPI: ${hb_mpicc:-no compiler wrapper}, ${hb_mpirun:-no mpirun} ($(hb_mpi_tag))"
    if [[ $hb_parallel_hdf5 == yes && -z $hb_mpicc ]]; then
        hb_log "parallel HDF5 at $hb_hdf5_inc, but no MPI compiler wrapper (MPICC, mpicc) to build h5py against it"
        hb_parallel_hdf5=no
    fi
    if [[ $hb_parallel_hdf5 == yes ]]; then
        hb_log "parallel HDF5 $hb_hdf5_version from $hb_hdf5_source ($hb_hdf5_lib)"
    else
        local seen=''
        ((${#hb_hdf5_serial[@]})) && seen="; found only: ${hb_hdf5_serial[*]}"
        hb_log "no parallel HDF5 (looked at HDF5_DIR, h5pcc on PATH, pkg-config hdf5-openmpi, hdf5-mpich, hdf5$seen): h5py from PyPI; point files are written by the gather writer"
    fi
}

# --- Python -------------------------------------------------------------------------------
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

# hb_h5py PY VERSION: h5py VERSION in PY, against parallel HDF5 when hb_system_packages
# found one (hb_h5py_mpi), else PyPI's wheel (serial HDF5: the gather writer).
hb_h5py() {
    local py=$1 version=$2
    if [[ $hb_parallel_hdf5 == yes ]]; then
        hb_h5py_mpi "$py" "$version"
        return 0
    fi
    if ! "$py" -c 'import h5py, sys; sys.exit(0 if h5py.__version__ == sys.argv[1] and not h5py.get_config().mpi else 1)' \
        "$version" 2>/dev/null; then
        hb_pip "$py" --force-reinstall --no-deps --only-binary=h5py "h5py==$version"
    fi
}

# hb_h5py_mpi PY VERSION: make h5py VERSION in PY a build against the parallel HDF5 that
# hb_find_hdf5 found, compiled with hb_mpicc. PyPI's h5py wheel has no MPI, so it is
# compiled once and the wheel is cached, keyed by python, the HDF5 (version and where it
# is), the MPI (hb_mpi_id) and mpi4py (h5py cimports mpi4py): loading another module of
# either builds anew. A wheel compiled against numpy 2 also runs on numpy >= 1.21 (numpy
# 2's C API is backward compatible), so one wheel serves both the numpy 2 environments and
# numpy 1.23 (legacy); a build made in a numpy-1 environment (no numpy-2 wheel cached yet)
# only runs on numpy 1 and is kept under its own key ("-numpy1").
# PY needs numpy, mpi4py, Cython, pkgconfig and setuptools installed.
hb_h5py_mpi() {
    local py=$1 version=$2
    if "$py" -c 'import h5py, sys; sys.exit(0 if h5py.__version__ == sys.argv[1] and h5py.get_config().mpi else 1)' \
        "$version" 2>/dev/null; then
        return 0
    fi
    local np_major key wheels tmp
    np_major=$("$py" -c 'import numpy; print(numpy.__version__.split(".")[0])')
    key="py$(hb_pyver "$py")-hdf5-$hb_hdf5_version-$(hb_hash "$hb_hdf5_inc" "$hb_hdf5_lib")-$(hb_mpi_id)"
    key+="-$("$py" -c 'import mpi4py; print("mpi4py" + mpi4py.__version__)')"
    wheels=$hb_cache/h5py-mpi/$key
    if [[ $np_major -lt 2 ]] && ! compgen -G "$wheels/h5py-$version-*.whl" >/dev/null; then
        wheels=$wheels-numpy$np_major
    fi
    if ! compgen -G "$wheels/h5py-$version-*.whl" >/dev/null; then
        hb_log "building h5py $version against parallel HDF5 $hb_hdf5_version (a few minutes, cached in $wheels)"
        tmp=$(mktemp -d)
        env -u HDF5_DIR -u HDF5_PKGCONFIG_NAME HDF5_MPI=ON CC="$hb_mpicc" HDF5_VERSION="$hb_hdf5_version" \
            HDF5_INCLUDEDIR="$hb_hdf5_inc" HDF5_LIBDIR="$hb_hdf5_lib" \
            "$py" -m pip wheel -q --disable-pip-version-check --no-deps --no-binary=h5py --no-build-isolation \
            -w "$tmp" "h5py==$version"
        mkdir -p "$wheels" && mv "$tmp"/h5py-*.whl "$wheels"/ && rmdir "$tmp"
    fi
    hb_pip "$py" --force-reinstall --no-deps "$wheels"/h5py-"$version"-*.whl
    "$py" -c 'import h5py, sys; sys.exit(0 if h5py.get_config().mpi else "h5py has no MPI support")'
}

# hb_build_record PY DIR: write DIR/hpcbench-build.json, the MPI and HDF5 libraries PY
# loads and the compiler, which every rank compares with what it loads
# (hpcbench/rank/linkage.py). PY needs hpcbench installed.
hb_build_record() {
    local py=$1 out=$2/hpcbench-build.json compiler tmp=$2/.hpcbench-build.json.$$
    compiler=$("${hb_mpicc:-cc}" --version 2>/dev/null | head -n 1) || compiler=''
    if ! (cd / && "$py" -m hpcbench.rank.linkage record --compiler "$compiler" --mpicc "$hb_mpicc" >"$tmp"); then
        rm -f "$tmp"
        hb_die "$py cannot write its build record (python -m hpcbench.rank.linkage record failed, see above)"
    fi
    mv -f "$tmp" "$out"
}
