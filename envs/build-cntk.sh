#!/usr/bin/env bash
# Build the `cntk` environment, idempotently (envs/build.sh cntk runs this):
#
#   ENV/bin/python        the rank's interpreter (the Python that runs this, >= 3.10): hpcbench's
#                         worker, mpi4py, parallel h5py (envs/cntk-rank.txt), no framework
#   ENV/cntk36/           a Python 3.6 virtualenv with CNTK 2.7 (envs/cntk.txt): CNTK 2.7, its
#                         last release, has wheels for Python 3.5 and 3.6 only
#   ENV/cntk36/mpi-shim/  libmpi.so.12 and libmpi_cxx.so.1, links to this site's Open MPI:
#                         CNTK's wheel was linked against Open MPI 1.10 and does not load
#                         without them (it loads them, it does not call MPI here)
#   ENV/bin/cntk-python   CNTK's interpreter with the shim on LD_LIBRARY_PATH: what the `cntk`
#                         adapter (hpcbench/frameworks/cntk) starts beside every rank
#
# ENV is ${HPCBENCH_ENVS_DIR:-<repo>/.envs}/cntk. The Python 3.6 interpreter is
# $HPCBENCH_PYTHON36, else pyenv's newest 3.6 ($(pyenv root)/versions/3.6.*), else python3.6
# on PATH; with none, one line says so and the build fails (`hpcbench check` then reports
# cntk as not built). pip's downloads are cached by pip; parallel h5py is the wheel
# envs/lib.sh caches in $HPCBENCH_CACHE. A second run with the same inputs only checks.
#
# Usage: envs/build.sh cntk   (or bash envs/build-cntk.sh)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
# shellcheck source=envs/lib.sh
source "$here/lib.sh"

hb_tag=build
hb_cache=${HPCBENCH_CACHE:-$HOME/.cache/hpcbench}
envs_dir=${HPCBENCH_ENVS_DIR:-$root/.envs}
env=$envs_dir/cntk
py=$env/bin/python
cntk_env=$env/cntk36
cntk_py=$cntk_env/bin/python
shim=$cntk_env/mpi-shim
h5py_version=3.14.0

# find_python36: the Python 3.6 interpreter to build CNTK's environment with (path on stdout).
find_python36() {
    local candidate pyenv_root
    if [[ -n ${HPCBENCH_PYTHON36:-} ]]; then
        candidate=$(command -v "$HPCBENCH_PYTHON36") ||
            hb_die "HPCBENCH_PYTHON36=$HPCBENCH_PYTHON36 is not an executable (allowed: the path of a Python 3.6 interpreter)"
        [[ $("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) == 3.6 ]] ||
            hb_die "HPCBENCH_PYTHON36=$HPCBENCH_PYTHON36 is not Python 3.6 (CNTK 2.7 has wheels for Python 3.5 and 3.6 only)"
        printf '%s\n' "$candidate"
        return 0
    fi
    if command -v pyenv >/dev/null && pyenv_root=$(pyenv root 2>/dev/null); then
        candidate=$(compgen -G "$pyenv_root/versions/3.6.*/bin/python3.6" | sort -V | tail -n 1) || candidate=''
        [[ -n $candidate ]] && { printf '%s\n' "$candidate"; return 0; }
    fi
    candidate=$(command -v python3.6) && { printf '%s\n' "$candidate"; return 0; }
    hb_die "no Python 3.6 interpreter for CNTK 2.7 (its wheels are for Python 3.5 and 3.6 only): none in \$(pyenv root)/versions/3.6.*, no python3.6 on PATH; set HPCBENCH_PYTHON36 to one"
}

mkdir -p "$envs_dir"
exec 9>"$envs_dir/.cntk.lock"
flock 9

py36=$(find_python36)
hb_system_packages
[[ $(hb_mpi_tag) == ompi* ]] ||
    hb_die "CNTK 2.7 was linked against Open MPI (libmpi.so.12, libmpi_cxx.so.1): this site's MPI is $(hb_mpi_tag); load an Open MPI 3 or 4"
mpi_libdir=$("${hb_mpicc:-mpicc}" --showme:libdirs 2>/dev/null | awk '{print $1}') || mpi_libdir=''
libmpi=$(realpath -e "$mpi_libdir/libmpi.so" 2>/dev/null) ||
    hb_die "Open MPI's libmpi.so not found in '$mpi_libdir' (mpicc --showme:libdirs)"
libmpi_cxx=$(realpath -e "$mpi_libdir/libmpi_cxx.so" 2>/dev/null) ||
    hb_die "Open MPI's C++ bindings (libmpi_cxx.so) are missing in $mpi_libdir: CNTK 2.7 needs them (Open MPI 5 dropped them; load an Open MPI 3 or 4)"

stamp=$env/.hpcbench-build
inputs=$(
    {
        cat "$here/cntk.txt" "$here/cntk-rank.txt" "$here/lib.sh" "${BASH_SOURCE[0]}"
        "$py36" --version 2>&1
        realpath "$py36"
        hb_mpi_id
        printf '%s\n' "$hb_parallel_hdf5" "$hb_hdf5_lib" "$libmpi" "$libmpi_cxx"
        hb_cxx_tag
        printf '%s\n' "$root"
    } | sha256sum | cut -c1-32
)
if [[ -x $py && -x $cntk_py && -f $stamp && $(<"$stamp") == "$inputs" ]]; then
    hb_log "up to date: $env (inputs unchanged; checking it)"
else
    rm -f "$stamp" "$env/hpcbench-build.json"
    # The rank's side.
    hb_venv "$env"
    hb_log "installing envs/cntk-rank.txt into $env"
    hb_pip "$py" -r "$here/cntk-rank.txt"
    hb_h5py "$py" "$h5py_version"
    purelib=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    [[ -L $purelib/hpcbench || ! -e $purelib/hpcbench ]] ||
        hb_die "$purelib/hpcbench is an installed copy of hpcbench: pip uninstall it from $env first"
    ln -sfn "$root/hpcbench" "$purelib/hpcbench"
    hb_build_record "$py" "$env"
    "$py" -m pip check >/dev/null || {
        "$py" -m pip check >&2
        hb_die "inconsistent dependencies in $env"
    }
    # CNTK's side: its own interpreter, the Open MPI name shim and the wrapper that joins them.
    hb_venv "$cntk_env" "$py36"
    hb_log "installing envs/cntk.txt into $cntk_env ($("$py36" --version 2>&1))"
    # From /: `python -m` puts the current folder on sys.path, and pip would take a checkout's
    # hpcbench metadata there for an installed package of this environment.
    (cd / && "$cntk_py" -m pip install -q --disable-pip-version-check -r "$here/cntk.txt")
    mkdir -p "$shim"
    ln -sfn "$libmpi" "$shim/libmpi.so.12"
    ln -sfn "$libmpi_cxx" "$shim/libmpi_cxx.so.1"
    cat >"$env/bin/cntk-python.tmp" <<EOF
#!/bin/sh
# CNTK 2.7's interpreter (written by envs/build-cntk.sh): Python 3.6 with the Open MPI shim.
LD_LIBRARY_PATH="$shim\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$cntk_py" "\$@"
EOF
    chmod +x "$env/bin/cntk-python.tmp"
    mv -f "$env/bin/cntk-python.tmp" "$env/bin/cntk-python"
fi

# --- check --------------------------------------------------------------------------------
check_log=$(mktemp)
summary=$(
    cd / && HB_ROOT=$root HB_PARALLEL=$hb_parallel_hdf5 "$py" - 2>"$check_log" <<'EOF'
import os, h5py, hpcbench, mpi4py, numpy
parallel = os.environ["HB_PARALLEL"] == "yes"
assert h5py.get_config().mpi == parallel, f"h5py built {'without' if parallel else 'with'} MPI"
here = os.path.realpath(hpcbench.__file__)
assert here.startswith(os.path.join(os.environ["HB_ROOT"], "")), f"hpcbench comes from {here}"
print(f"mpi4py {mpi4py.__version__}, numpy {numpy.__version__}, h5py {h5py.__version__} "
      f"({'parallel HDF5' if parallel else 'serial HDF5: gather writer'})")
EOF
) && cntk_summary=$(
    cd / && "$env/bin/cntk-python" -W ignore - 2>>"$check_log" <<'EOF'
import sys, numpy as np, cntk as C
x = C.input_variable((2,), np.float32)
w = C.parameter((2, 1), init=1.0)
out = C.times(x, w).eval({x: np.ones((1, 2), np.float32)})
assert float(out.ravel()[0]) == 2.0, out
print("cntk %s on Python %d.%d.%d, numpy %s" % ((C.__version__,) + sys.version_info[:3] + (np.__version__,)))
EOF
) || {
    cat "$check_log" >&2
    rm -f "$check_log"
    hb_die "$env does not work (see above); rerun after fixing, or delete it to start over"
}
rm -f "$check_log"
[[ -f $stamp && $(<"$stamp") == "$inputs" ]] || printf '%s\n' "$inputs" >"$stamp"
hb_log "ready: cntk ($py): $summary; $cntk_summary"
