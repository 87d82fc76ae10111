#!/usr/bin/env bash
# Build the `caffe` environment (envs/build.sh caffe runs this), from nothing, idempotently:
# Caffe 1.0 (CPU) is packaged only by Debian up to 11 (bullseye: python3-caffe, for its
# Python 3.9) and by no package index, so the environment is a Debian 11 root filesystem
# made with debootstrap, holding pycaffe, Open MPI 4.1, mpi4py and h5py built against
# parallel HDF5 (Debian's python3-h5py-mpi), NumPy, PyYAML, psutil and threadpoolctl.
#
#   ENV/rootfs        the root filesystem (unpacked from the cached tarball)
#   ENV/bin/python    a wrapper that enters it (see write_wrapper) and runs its python3
#   ENV/hpcbench-build.json   the build record (a copy of rootfs/usr/hpcbench-build.json,
#                     the one the ranks read: their sys.prefix is /usr)
#
# hpcbench itself is a link in the root filesystem to this clone's package, whose path is
# the same inside (the wrapper makes it visible there). The rank-side code runs on Python
# 3.9 for this (tests/unit/test_python39.py keeps it so).
#
# The slow part (debootstrap and apt inside it: about 5 minutes) is cached outside the clone
# as a tarball in $HPCBENCH_CACHE/caffe-rootfs, keyed by the suite, the architecture and
# the package list; with the tarball there a build only unpacks it (seconds); with the
# environment in place and its inputs unchanged a second run only checks it (seconds).
#
# Needs root: debootstrap, and entering the root filesystem (mount namespace, bind mounts,
# chroot). On a cluster the same root filesystem is a container image named in the site
# profile.
#
# Usage: envs/build-caffe.sh
#   HPCBENCH_ENVS_DIR       where environments live (default: .envs at the repository root)
#   HPCBENCH_CACHE          the build cache (default ~/.cache/hpcbench)
#   HPCBENCH_DEBIAN_MIRROR  the Debian archive (default http://deb.debian.org/debian)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
# shellcheck source=envs/lib.sh
source "$here/lib.sh"

hb_tag=build
hb_cache=${HPCBENCH_CACHE:-$HOME/.cache/hpcbench}
envs_dir=${HPCBENCH_ENVS_DIR:-$root/.envs}
env=$envs_dir/caffe
rootfs=$env/rootfs
suite=bullseye
mirror=${HPCBENCH_DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages=(python3-caffe caffe python3-mpi4py python3-h5py-mpi openmpi-bin libopenblas0 python3-numpy python3-yaml
    python3-psutil python3-threadpoolctl)
rootfs_rev=r1 # changes when the way the tree is made changes (a new tarball, not a reused one)

[[ $(id -u) -eq 0 ]] ||
    hb_die "the caffe environment is a Debian 11 root filesystem entered with a mount namespace and chroot: build it as root (ranks run it as root too)"
command -v unshare >/dev/null && command -v chroot >/dev/null ||
    hb_die "unshare and chroot are needed (util-linux, coreutils)"

mkdir -p "$envs_dir"
exec 9>"$envs_dir/.caffe.lock"
flock 9

# --- the root filesystem, cached as a tarball ----------------------------------------------
arch=$(dpkg --print-architecture 2>/dev/null || uname -m)
key=$suite-$arch-$(hb_hash "${packages[*]}" "$rootfs_rev")
tarball=$hb_cache/caffe-rootfs/$key.tar.zst

# in_root CMD...: run CMD in the root filesystem under construction, /proc and /dev mounted
# in a mount namespace of its own (nothing stays mounted when it ends).
in_root() {
    local tree=$1
    shift
    unshare -m --propagation private -- sh -c \
        'mount -t proc proc "$0/proc" && mount --rbind /dev "$0/dev" && exec chroot "$0" "$@"' \
        "$tree" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 "$@"
}

make_tarball() {
    hb_apt_ensure debootstrap zstd
    local work tree
    mkdir -p "$hb_cache/caffe-rootfs"
    work=$(mktemp -d "$hb_cache/caffe-rootfs/.build.XXXXXX")
    tree=$work/rootfs
    hb_log "debootstrap $suite ($arch) from $mirror (about a minute; log $work/debootstrap.log)"
    debootstrap --variant=minbase --arch="$arch" "$suite" "$tree" "$mirror" >"$work/debootstrap.log" 2>&1 || {
        tail -n 20 "$work/debootstrap.log" >&2
        hb_die "debootstrap failed; full log: $work/debootstrap.log"
    }
    hb_log "apt-get install ${packages[*]} (a few minutes; log $work/apt.log)"
    {
        in_root "$tree" apt-get update -qq &&
            in_root "$tree" apt-get install -y -qq --no-install-recommends "${packages[@]}" &&
            in_root "$tree" apt-get clean
    } >"$work/apt.log" 2>&1 || {
        tail -n 20 "$work/apt.log" >&2
        hb_die "apt-get in the root filesystem failed; full log: $work/apt.log"
    }
    rm -rf "$tree"/var/lib/apt/lists/* "$tree"/usr/share/doc/* "$tree"/usr/share/man/*
    hb_log "packing the root filesystem into $tarball"
    tar -C "$tree" --numeric-owner -cf - . | zstd -q -T0 -3 -o "$work/rootfs.tar.zst"
    mv "$work/rootfs.tar.zst" "$tarball"
    rm -rf "$work"
}

# --- the interpreter: a wrapper that enters the root filesystem ----------------------------
# Every rank is its own mount namespace (unshare -m: private propagation, gone when the rank
# ends, so nothing is left mounted and two ranks never share or race over mounts). In it
# the host's /proc, /sys, /dev (with /dev/shm: Open MPI's shared memory between the ranks),
# /run and /tmp (Open MPI's session directory, where the ranks find mpirun's PMIx server)
# are bind-mounted into the root filesystem, as is every top-level directory of the host
# that is not part of an operating system (/root, /home, /work, /scratch, ...), each at its
# own path: the sweep directory, the project checkout, data directories and the current
# folder have the same paths inside. Paths under a system directory (the current folder,
# this clone, and those in HPCBENCH_CAFFE_BIND, colon-separated) are bind-mounted one by
# one. The host's /etc/hosts and /etc/resolv.conf replace the root filesystem's.
write_wrapper() {
    mkdir -p "$env/bin"
    cat >"$env/bin/python.tmp" <<EOF
#!/usr/bin/env bash
# The caffe environment's interpreter: Debian 11's python3 in $rootfs (envs/build-caffe.sh).
set -euo pipefail
rootfs=$(printf '%q' "$rootfs")
checkout=$(printf '%q' "$root")
EOF
    cat >>"$env/bin/python.tmp" <<'EOF'
if [[ ${HPCBENCH_CAFFE_ENTERED:-} != "$rootfs" ]]; then
    [[ $(id -u) -eq 0 ]] || { echo "caffe environment: entering $rootfs needs root (mount namespace, chroot)" >&2; exit 1; }
    HPCBENCH_CAFFE_ENTERED=$rootfs exec unshare -m --propagation private -- "$0" "$@"
fi
bind() { # bind SOURCE: the host's SOURCE at the same path inside
    local target=$rootfs$1
    if [[ -d $1 ]]; then mkdir -p "$target"; else [[ -e $target ]] || touch "$target"; fi
    mount --rbind "$1" "$target"
}
system=" bin boot dev etc lib lib32 lib64 libx32 lost+found proc run sbin sys tmp usr var "
for dir in /proc /sys /dev /run /tmp; do bind "$dir"; done
for dir in /*; do
    [[ -d $dir && ! -L $dir && $system != *" ${dir#/} "* ]] && bind "$dir"
done
extra=$PWD:$checkout:${HPCBENCH_CAFFE_BIND:-}
IFS=: read -ra paths <<<"$extra"
for path in "${paths[@]}"; do
    [[ -n $path && -e $path ]] || continue
    path=$(realpath "$path")
    top=${path#/}
    [[ $system == *" ${top%%/*} "* && ${top%%/*} != tmp ]] && bind "$path"
done
for file in /etc/hosts /etc/resolv.conf; do [[ -f $file && -f $rootfs$file ]] && mount --bind "$file" "$rootfs$file"; done
# Nothing of the host's Python or libraries inside; MPI and Caffe set up for ranks.
exec chroot "$rootfs" /usr/bin/env -u PYTHONPATH -u PYTHONHOME -u LD_LIBRARY_PATH -u LD_PRELOAD -u HPCBENCH_CAFFE_ENTERED \
    -C "$PWD" PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin \
    H5PY_ALWAYS_USE_MPI=1 GLOG_minloglevel="${GLOG_minloglevel:-2}" PMIX_MCA_psec="${PMIX_MCA_psec:-native}" \
    /usr/bin/python3 "$@"
EOF
    chmod +x "$env/bin/python.tmp"
    mv -f "$env/bin/python.tmp" "$env/bin/python"
}

# --- the environment ----------------------------------------------------------------------
stamp=$env/.hpcbench-build
inputs=$(
    {
        printf '%s\n' "$key" "$root"
        sed -n '/^write_wrapper()/,/^}/p' "${BASH_SOURCE[0]}"
    } | sha256sum | cut -c1-32
)
if [[ -x $env/bin/python && -f $rootfs/usr/bin/python3 && -f $stamp && $(<"$stamp") == "$inputs" ]]; then
    hb_log "up to date: $env (inputs unchanged; checking it)"
else
    rm -f "$stamp" "$env/hpcbench-build.json"
    [[ -f $tarball ]] || make_tarball
    hb_apt_ensure zstd
    if [[ ! -f $rootfs/.hpcbench-rootfs || $(<"$rootfs/.hpcbench-rootfs") != "$key" ]]; then
        hb_log "unpacking $tarball into $rootfs"
        rm -rf "$rootfs" "$rootfs.tmp"
        mkdir -p "$rootfs.tmp"
        zstd -q -d -c "$tarball" | tar -C "$rootfs.tmp" --numeric-owner -xf -
        printf '%s\n' "$key" >"$rootfs.tmp/.hpcbench-rootfs"
        rm -f "$rootfs.tmp/etc/resolv.conf" # files the host's are bind-mounted on
        touch "$rootfs.tmp/etc/hosts" "$rootfs.tmp/etc/resolv.conf"
        mv "$rootfs.tmp" "$rootfs"
    fi
    # hpcbench from this clone: a link to the package (its path is the same inside).
    ln -sfn "$root/hpcbench" "$rootfs/usr/local/lib/python3.9/dist-packages/hpcbench"
    write_wrapper
    (cd / && "$env/bin/python" -m hpcbench.rank.linkage record >"$rootfs/usr/hpcbench-build.json.tmp") ||
        hb_die "$env/bin/python cannot write its build record (python -m hpcbench.rank.linkage record failed, see above)"
    mv -f "$rootfs/usr/hpcbench-build.json.tmp" "$rootfs/usr/hpcbench-build.json"
    cp "$rootfs/usr/hpcbench-build.json" "$env/hpcbench-build.json"
fi

# --- check --------------------------------------------------------------------------------
check_log=$(mktemp)
summary=$(
    cd / && HB_ROOT=$root "$env/bin/python" - 2>"$check_log" <<'EOF'
import os, caffe, h5py, mpi4py, numpy, hpcbench
import hpcbench.worker, hpcbench.frameworks.caffe  # the rank side imports on this Python
assert h5py.get_config().mpi, "h5py built without MPI"
here = os.path.realpath(hpcbench.__file__)
assert here.startswith(os.path.join(os.environ["HB_ROOT"], "")), f"hpcbench comes from {here}"
print(f"caffe {caffe.__version__}, python {'.'.join(map(str, os.sys.version_info[:3]))}, "
      f"numpy {numpy.__version__}, mpi4py {mpi4py.__version__}, h5py {h5py.__version__} (parallel HDF5)")
EOF
) || {
    cat "$check_log" >&2
    rm -f "$check_log"
    hb_die "$env does not work (see above); rerun after fixing, or delete it to start over"
}
rm -f "$check_log"
[[ -f $stamp && $(<"$stamp") == "$inputs" ]] || printf '%s\n' "$inputs" >"$stamp"
hb_log "ready: caffe ($env/bin/python): $summary"
