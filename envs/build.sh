#!/usr/bin/env bash
# Build one framework environment, from nothing, idempotently:
#
#   modern   torch 2.13.0 (CPU) + tensorflow-cpu 2.21.0 (Keras 3) + Horovod 0.28.1
#            (PyTorch, TensorFlow, Gloo, MPI)
#   legacy   mxnet 1.9.1 + numpy 1.23.5 + Horovod 0.28.1 (MXNet, Gloo, MPI)
#
# They cannot share one interpreter: MXNet 1.9.1 imports only with numpy < 1.24, which
# TensorFlow 2.21 refuses. Each gets the pinned set of envs/NAME.txt, h5py compiled against
# parallel HDF5 (envs/lib.sh; PyPI's h5py where the site has none), Horovod compiled
# against that env's frameworks and the MPI envs/lib.sh finds (the site's first), a build
# record (ENV/hpcbench-build.json, see hpcbench/rank/linkage.py), and hpcbench itself (a
# link to this clone's package, so no dependency is installed twice and edits need no
# reinstall). Slow builds are cached outside the clone in $HPCBENCH_CACHE
# (default ~/.cache/hpcbench) as wheels, keyed by everything they are compiled against.
# A second run with everything in place only checks the environment (seconds).
#
# Usage: envs/build.sh NAME        (NAME: modern | legacy)
#   HPCBENCH_ENVS_DIR   where environments live (default: .envs at the repository root);
#                       the environment is $HPCBENCH_ENVS_DIR/NAME (see hpcbench/envs.py)
#   HPCBENCH_CACHE      wheel cache (default ~/.cache/hpcbench)
#   MPICC, HDF5_DIR     the MPI compiler wrapper and parallel HDF5 prefix to use (envs/lib.sh)
#   MAKEFLAGS           parallel compile jobs (default -j2)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
# shellcheck source=envs/lib.sh
source "$here/lib.sh"

hb_tag=build
hb_cache=${HPCBENCH_CACHE:-$HOME/.cache/hpcbench}
name=${1:-}
case $name in
modern | legacy) ;;
# Environments that are not a pinned virtualenv with Horovod have a build script of their own.
caffe | cntk) exec bash "$here/build-$name.sh" ;;
*)
    echo "usage: envs/build.sh modern|legacy|caffe|cntk" >&2
    exit 2
    ;;
esac
envs_dir=${HPCBENCH_ENVS_DIR:-$root/.envs}
env=$envs_dir/$name
py=$env/bin/python
reqs=$here/$name.txt
horovod_version=0.28.1
h5py_version=3.14.0 # TensorFlow 2.21 needs h5py < 3.15; the same wheel serves legacy
export MAKEFLAGS=${MAKEFLAGS:--j2}

case $name in
modern)
    frameworks=(torch tensorflow-cpu)
    horovod_flags=(HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1)
    verify='import horovod.torch as ht, horovod.tensorflow as htf, torch, tensorflow as tf
assert ht.mpi_built() and ht.gloo_built(), "horovod.torch lacks MPI or Gloo"
assert htf.mpi_built() and htf.gloo_built(), "horovod.tensorflow lacks MPI or Gloo"
stack = f"torch {torch.__version__}, tensorflow {tf.__version__}"'
    ;;
legacy)
    frameworks=(mxnet)
    horovod_flags=(HOROVOD_WITH_MXNET=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1)
    verify='import mxnet as mx, horovod.mxnet as hmx
assert hmx.mpi_built() and hmx.gloo_built(), "horovod.mxnet lacks MPI or Gloo"
stack = f"mxnet {mx.__version__}"'
    ;;
esac
horovod_flags+=(HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1)

# One build of an environment at a time (a second caller waits, then finds it done).
mkdir -p "$envs_dir"
exec 9>"$envs_dir/.$name.lock"
flock 9

# The site's MPI and parallel HDF5 (apt only as root, only for what is missing).
hb_system_packages

# --- Horovod ------------------------------------------------------------------------------
# The patches applied to the unpacked sdist before compiling. Changing them changes the
# cache key (hvd_patch_rev), so a wheel built without a patch is never reused.
hvd_patch_rev=p1
horovod_patch() {
    local src=$1
    if [[ " ${frameworks[*]} " == *" torch "* ]]; then
        # torch >= 2.1 headers need C++17, but horovod/torch/CMakeLists.txt asks for C++14
        # (and the top CMakeLists strips any -std= from CXXFLAGS, so it cannot be set from
        # outside): compile the torch extension as C++17.
        sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/horovod/torch/CMakeLists.txt"
        grep -q 'set(CMAKE_CXX_STANDARD 17)' "$src/horovod/torch/CMakeLists.txt" ||
            hb_die "horovod patch (torch C++17) did not apply"
        # The torch extension links the bundled gloo, compiled as C++11. Its headers seen as
        # C++17 make `static constexpr` members inline, while the C++11 objects also define
        # them: the link fails on a duplicate gloo::rendezvous::Store::kDefaultTimeout.
        # Compile the bundled gloo as C++17 too (what Horovod already does for its TF copy).
        sed -i -e 's/-std=c++11 -fPIC/-std=c++17 -fPIC/' -e '1i set(CMAKE_CXX_STANDARD 17)' \
            "$src/third_party/gloo/CMakeLists.txt"
        grep -q -- '-std=c++17 -fPIC' "$src/third_party/gloo/CMakeLists.txt" ||
            hb_die "horovod patch (gloo C++17) did not apply"
    fi
    if [[ " ${frameworks[*]} " == *" tensorflow-cpu "* ]]; then
        # horovod/tensorflow/xla_mpi_ops.cc (XLA custom calls, used only on GPUs) includes
        # tensorflow/compiler/xla/... headers that TF >= 2.16 moved (to xla/...): it does not
        # compile. This is a CPU build: leave the file out.
        sed -i '/xla_mpi_ops\.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
        ! grep -q 'xla_mpi_ops' "$src/horovod/tensorflow/CMakeLists.txt" ||
            hb_die "horovod patch (no XLA ops) did not apply"
    fi
}

# Everything the Horovod wheel is compiled against: python, each framework, MPI, compiler.
horovod_key() {
    local f versions
    versions=$("$py" - "${frameworks[@]}" <<'EOF'
import sys
from importlib.metadata import version
print("-".join(f"{name.removesuffix('-cpu')}{version(name)}" for name in sys.argv[1:]))
EOF
    )
    printf 'py%s-%s-%s-%s-%s' "$(hb_pyver "$py")" "$versions" "$(hb_mpi_tag)" "$(hb_cxx_tag)" "$hvd_patch_rev"
}

horovod_install() {
    local key wheels tmp log
    key=$(horovod_key)
    if [[ -f $env/.horovod-key && $(<"$env/.horovod-key") == "$key" ]] &&
        "$py" -c 'import horovod, sys; sys.exit(horovod.__version__ != sys.argv[1])' "$horovod_version" 2>/dev/null; then
        return 0
    fi
    wheels=$hb_cache/horovod-$horovod_version/$key
    if ! compgen -G "$wheels/horovod-$horovod_version-*.whl" >/dev/null; then
        tmp=$(mktemp -d)
        log=$tmp/build.log
        hb_log "building Horovod $horovod_version for $key (several minutes; log $log; cached in $wheels)"
        "$py" -m pip download -q --disable-pip-version-check --no-deps --no-binary=:all: \
            "horovod==$horovod_version" -d "$tmp"
        tar -xzf "$tmp/horovod-$horovod_version.tar.gz" -C "$tmp"
        horovod_patch "$tmp/horovod-$horovod_version"
        if ! env "${horovod_flags[@]}" "$py" -m pip wheel -v --disable-pip-version-check --no-deps \
            --no-build-isolation -w "$tmp/dist" "$tmp/horovod-$horovod_version" >"$log" 2>&1; then
            tail -n 40 "$log" >&2
            hb_die "Horovod build failed; full log: $log"
        fi
        mkdir -p "$wheels" && mv "$tmp"/dist/horovod-*.whl "$wheels"/
        cp "$log" "$wheels/build.log"
        rm -rf "$tmp"
    fi
    hb_pip "$py" --force-reinstall --no-deps "$wheels"/horovod-"$horovod_version"-*.whl
    printf '%s\n' "$key" >"$env/.horovod-key"
}

# --- the environment --------------------------------------------------------------------
# The stamp holds a digest of every input of this build; with the environment in place and
# the same inputs, nothing is installed and only the check below runs.
stamp=$env/.hpcbench-build
inputs=$(
    {
        cat "$reqs" "$here/lib.sh" "${BASH_SOURCE[0]}" "$here/build-constraints.txt"
        hb_mpi_id
        printf '%s\n' "$hb_parallel_hdf5" "$hb_hdf5_lib"
        hb_cxx_tag
        printf '%s\n' "$root"
    } | sha256sum | cut -c1-32
)
if [[ -x $py && -f $stamp && $(<"$stamp") == "$inputs" ]]; then
    hb_log "up to date: $env (inputs unchanged; checking it)"
else
    rm -f "$stamp" "$env/hpcbench-build.json"
    hb_venv "$env"
    hb_log "installing envs/$name.txt into $env"
    # Source-only packages build in pip's isolated environment with the newest setuptools
    # unless constrained (envs/build-constraints.txt says why).
    PIP_CONSTRAINT=$here/build-constraints.txt hb_pip "$py" -r "$reqs"
    horovod_install
    hb_h5py "$py" "$h5py_version"
    # hpcbench from this clone, without installing its dependencies a second time: a link
    # to the package. (A .pth naming the clone would also expose the clone's other folders
    # and the hpcbench-dl metadata that envs/setup.sh's editable install leaves there, whose
    # requirements, pandas among them, these environments do not need.)
    purelib=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    [[ -L $purelib/hpcbench || ! -e $purelib/hpcbench ]] ||
        hb_die "$purelib/hpcbench is an installed copy of hpcbench: pip uninstall it from $env first"
    ln -sfn "$root/hpcbench" "$purelib/hpcbench"
    hb_build_record "$py" "$env"
    "$py" -m pip check >/dev/null || {
        "$py" -m pip check >&2
        hb_die "inconsistent dependencies in $env"
    }
fi

# --- check --------------------------------------------------------------------------------
check_log=$(mktemp)
summary=$(
    cd / && HB_ROOT=$root HB_PARALLEL=$hb_parallel_hdf5 TF_CPP_MIN_LOG_LEVEL=3 "$py" - 2>"$check_log" <<EOF
$verify
import os, h5py, horovod, hpcbench, numpy
parallel = os.environ["HB_PARALLEL"] == "yes"
assert h5py.get_config().mpi == parallel, f"h5py built {'without' if parallel else 'with'} MPI"
here = os.path.realpath(hpcbench.__file__)
assert here.startswith(os.path.join(os.environ["HB_ROOT"], "")), f"hpcbench comes from {here}"
print(f"{stack}, horovod {horovod.__version__} (gloo, mpi), numpy {numpy.__version__}, "
      f"h5py {h5py.__version__} ({'parallel HDF5' if parallel else 'serial HDF5: gather writer'})")
EOF
) || {
    cat "$check_log" >&2
    rm -f "$check_log"
    hb_die "$env does not work (see above); rerun after fixing, or delete it to start over"
}
rm -f "$check_log" # what the frameworks print while importing, shown only on failure
[[ -f $stamp && $(<"$stamp") == "$inputs" ]] || printf '%s\n' "$inputs" >"$stamp"
hb_log "ready: $name ($py): $summary"
