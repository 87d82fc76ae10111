"""Installing as a cluster user would: no root, the site's MPI and parallel HDF5 (not
Debian's package records), and the package installed from a copy of the source.

The set-up (as root) makes a user without root (`useradd`), a copy of this working tree in
its home (a user's clone), a PATH that holds the system's programs but no MPI, HDF5 or
pkg-config tools, and, as a site's modules would, a prefix with `mpicc` and `mpirun` (links
to the system's Open MPI) and an HDF5 prefix for `HDF5_DIR` made of links to the system's
parallel HDF5 files. Then `envs/setup.sh` runs as that user into a virtual environment in
its home: with the MPI and `HDF5_DIR` (parallel h5py, the 'mpio' driver writing from two
real ranks), with the MPI alone (PyPI's h5py, a real sweep written by the gather writer),
and with neither (a one-line error, nothing created).

To stay fast the environments get the part of envs/requirements-core.txt that hpcbench's
core needs (`HPCBENCH_REQUIREMENTS`; the pins are the file's own, no torch), the user's pip
cache and the user's wheel cache (~/.cache/hpcbench) persist between runs, and the parallel
h5py wheel already built by the root's envs/setup.sh is copied into the user's cache: the
cache key names the same MPI and HDF5 files (resolved paths), so it is the same build. Run
times are printed (pytest -s).

The last test installs the package (`pip install`, not editable) from a copy of the source
into a fresh environment and runs `hpcbench` from outside any checkout. That environment
sees the project's .venv through a .pth line (what `--system-site-packages` would do with
an interpreter that has them) so that torch & co are not installed again; the hpcbench it
imports is its own copy, not the checkout's.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcbench.plan import envs
from hpcbench.rank import linkage
from hpcbench.testing.installed import Installed, copy_tree
from tests.conftest import skip_unless_required

pytestmark = pytest.mark.slow

ROOT = envs.ROOT
USER = "hbsite"
# What of envs/requirements-core.txt the core of hpcbench (worker, sweep command, check)
# and the parallel h5py build need.
CORE = {"numpy", "pyyaml", "mpi4py", "psutil", "threadpoolctl", "rich", "cython", "pkgconfig", "setuptools", "wheel"}
# Programs a login node without the MPI and HDF5 modules loaded does not have.
HIDDEN = ("h5", "mpi", "orte", "ompi", "opal", "pkg-config", "pkgconf", "x86_64-linux-gnu-pkg-config")
SETUP_TIMEOUT = 1500  # a first run compiles h5py when no cached wheel fits (minutes on 2 cores)
SETUP_TEST_TIMEOUT = SETUP_TIMEOUT + 300


def system_hdf5() -> tuple[Path, Path] | None:
    """(include dir, library dir) of the system's parallel HDF5, from pkg-config."""
    for name in ("hdf5-openmpi", "hdf5-mpich"):
        try:
            flags = subprocess.run(
                ["pkg-config", "--cflags-only-I", "--libs-only-L", name], capture_output=True, text=True, check=True
            ).stdout.split()
        except (OSError, subprocess.CalledProcessError):
            continue
        incs = [Path(f[2:]) for f in flags if f.startswith("-I") and Path(f[2:], "H5pubconf.h").is_file()]
        libs = [Path(f[2:]) for f in flags if f.startswith("-L") and Path(f[2:], "libhdf5.so").exists()]
        if incs and libs:
            return incs[0], libs[0]
    return None


def chown(path: Path, user: pwd.struct_passwd) -> None:
    for p in [path, *path.rglob("*")]:
        os.lchown(p, user.pw_uid, user.pw_gid)


class Site:
    """The user, its home, its clone and what its site provides."""

    def __init__(self, user: pwd.struct_passwd) -> None:
        self.user = user
        self.home = Path(user.pw_dir)
        self.clone = self.home / "hpcbench"
        self.bin = self.home / "site" / "bin"  # the system's programs, without MPI and HDF5 tools
        self.mpi = self.home / "site" / "mpi"  # what `module load openmpi` would put on PATH
        self.hdf5 = self.home / "site" / "hdf5"  # what `module load hdf5` would name in HDF5_DIR
        self.requirements = self.home / "site" / "requirements-core-subset.txt"
        self.cache = self.home / ".cache" / "hpcbench"

    def env(self, without_mpi: bool = False, extra: dict[str, str] | None = None) -> dict[str, str]:
        path = [] if without_mpi else [str(self.mpi / "bin")]
        env = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}  # this machine's package index
        env.update(HOME=str(self.home), USER=USER, LOGNAME=USER, LANG="C.UTF-8", PATH=":".join([*path, str(self.bin)]))
        env.update(HPCBENCH_REQUIREMENTS=str(self.requirements), PYTHON="python3")
        env.update(extra or {})
        return env

    def run(self, *argv: str | Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """`argv` as the user, with exactly `env`, in its home; on a time-out, everything
        it started is ended (its own process group)."""
        command = ["runuser", "-u", USER, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *map(str, argv)]
        with subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=self.home,
            start_new_session=True,
        ) as proc:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
                raise AssertionError(f"{command} ran over {timeout} s: {err[-2000:]}") from None
        return subprocess.CompletedProcess(command, proc.returncode, out, err)

    def setup(self, venv: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
        if venv.exists():
            shutil.rmtree(venv)
        start = time.monotonic()
        proc = self.run("bash", self.clone / "envs" / "setup.sh", venv, env=env, timeout=SETUP_TIMEOUT)
        return proc, time.monotonic() - start


def make_site(user: pwd.struct_passwd, hdf5: tuple[Path, Path]) -> Site:
    site = Site(user)
    if site.clone.exists():
        shutil.rmtree(site.clone)
    copy_tree(site.clone)
    for folder in (site.bin, site.mpi / "bin", site.hdf5):
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
    for program in sorted(Path("/usr/bin").iterdir()):
        if not program.name.startswith(HIDDEN):
            (site.bin / program.name).symlink_to(program)
    for tool in ("mpicc", "mpirun"):
        found = shutil.which(tool)
        assert found, f"{tool} is not on PATH: envs/setup.sh installs Open MPI"
        (site.mpi / "bin" / tool).symlink_to(os.path.realpath(found))
    (site.hdf5 / "include").symlink_to(hdf5[0])
    (site.hdf5 / "lib").symlink_to(hdf5[1])
    wanted = [
        line
        for line in (ROOT / "envs" / "requirements-core.txt").read_text().splitlines()
        if line.split("==")[0].strip().lower() in CORE
    ]
    assert len(wanted) == len(CORE), f"envs/requirements-core.txt no longer pins all of {sorted(CORE)}"
    site.requirements.write_text("\n".join(wanted) + "\n")
    # The parallel h5py wheels the root's envs/setup.sh built (same MPI and HDF5 files).
    root_cache = Path(os.environ.get("HPCBENCH_CACHE") or Path.home() / ".cache" / "hpcbench") / "h5py-mpi"
    if root_cache.is_dir():
        for key in root_cache.iterdir():
            if not (site.cache / "h5py-mpi" / key.name).exists():
                shutil.copytree(key, site.cache / "h5py-mpi" / key.name)
    chown(site.home, user)
    return site


@pytest.fixture(scope="module")
def site() -> Site:
    if os.geteuid() != 0:
        skip_unless_required("the set-up creates a user (useradd): run as root, as CI does")
    hdf5 = system_hdf5()
    if hdf5 is None or shutil.which("useradd") is None or shutil.which("runuser") is None:
        skip_unless_required("needs the system's parallel HDF5 (envs/setup.sh installs it), useradd and runuser")
    try:
        user = pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", USER], check=True)
        user = pwd.getpwnam(USER)
    assert user.pw_uid != 0
    return make_site(user, hdf5)


def last_line(proc: subprocess.CompletedProcess[str]) -> str:
    return (proc.stderr.strip().splitlines() or [""])[-1]


@pytest.mark.timeout(SETUP_TEST_TIMEOUT)
def test_a_user_without_root_builds_on_the_sites_mpi_and_parallel_hdf5(site: Site) -> None:
    venv = site.home / "venvs" / "parallel"
    proc, took = site.setup(venv, site.env(extra={"HDF5_DIR": str(site.hdf5)}))
    print(f"envs/setup.sh as {USER}, site MPI and HDF5_DIR: {took:.0f} s")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert last_line(proc) == f"[setup] ready: {venv} (parallel HDF5: yes)"
    assert f"[setup] MPI: {site.mpi / 'bin' / 'mpicc'}, {site.mpi / 'bin' / 'mpirun'} (ompi" in proc.stderr
    assert "from HDF5_DIR" in proc.stderr
    assert "apt-get" not in proc.stderr
    assert not proc.stderr.count("building h5py") > 1
    # what was built is owned by the user and records what it links against
    record = json.loads((venv / linkage.BUILD_RECORD).read_text())
    assert record["hdf5_parallel"] is True
    assert record["mpicc"] == str(site.mpi / "bin" / "mpicc")
    assert record["mpi_library"].startswith("Open MPI v")
    stat = (venv / linkage.BUILD_RECORD).stat()
    assert stat.st_uid == site.user.pw_uid
    assert stat.st_mode & 0o777 == (venv / "pyvenv.cfg").stat().st_mode & 0o777  # as the rest of the environment
    assert [p.name for p in (site.cache / "h5py-mpi").glob("*/h5py-3.14.0-*.whl")]
    # the libraries it loads are those it was built against
    check = site.run(venv / "bin" / "python", "-m", "hpcbench.rank.linkage", "check", env=site.env())
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.startswith(f"agrees with {venv / linkage.BUILD_RECORD}: MPI 'Open MPI v")
    # a real point: two mpirun ranks write its file through parallel HDF5
    logs = run_point(site, venv, "mpio", "options: {writer: mpio}\n")
    assert "writer mpio" in logs


def run_point(site: Site, venv: Path, name: str, extra: str = "") -> str:
    """Run a 2-rank synthetic point through `hpcbench run` as the user; its log."""
    spec = site.home / f"{name}.yaml"
    spec.write_text(
        f"name: {name}\nexecutor: local\nmatrix:\n  ranks_per_node: [2]\n"
        "fixed: {framework: synthetic, backend: none, launcher: mpirun, model: sleep, iterations: 4, warmup: 1}\n"
        + extra
    )
    os.lchown(spec, site.user.pw_uid, site.user.pw_gid)
    out = site.home / "runs" / name
    if out.exists():
        shutil.rmtree(out)
    sweep = site.run(venv / "bin" / "python", "-m", "hpcbench", "run", spec, "--out", out, env=site.env())
    logs = "".join(p.read_text(errors="replace")[-2000:] for p in sorted((out / "logs").glob("*.log")))
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr + logs
    assert len(list(out.glob("*.h5"))) == 1
    return logs


@pytest.mark.timeout(SETUP_TEST_TIMEOUT)
def test_without_parallel_hdf5_setup_succeeds_with_the_gather_writer(site: Site, tmp_path: Path) -> None:
    venv = site.home / "venvs" / "gather"
    proc, took = site.setup(venv, site.env())
    print(f"envs/setup.sh as {USER}, site MPI, no parallel HDF5: {took:.0f} s")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert last_line(proc) == f"[setup] ready: {venv} (parallel HDF5: no (gather writer))"
    assert "[setup] no parallel HDF5 (looked at HDF5_DIR, h5pcc on PATH, pkg-config" in proc.stderr
    python = venv / "bin" / "python"
    # hpcbench check says so, from any folder (this interpreter in detail: its venv's name)
    check = site.run(python, "-m", "hpcbench", "check", "--env", venv.name, env=site.env())
    assert check.returncode == 0, check.stderr
    lines = [line.strip() for line in check.stdout.splitlines()]
    hdf5 = next(line for line in lines if line.startswith("parallel HDF5 "))
    assert hdf5.split(None, 2)[2].startswith("no (gather writer): h5py 3.14.0, HDF5 ")
    assert "built without MPI" in hdf5
    build = next(line for line in lines if line.startswith("build record "))
    assert build.split(None, 2)[2].startswith("works: the MPI and HDF5 loaded are those of ")
    # a real point: two mpirun ranks, its file written by the gather writer
    assert "writer gather" in run_point(site, venv, "gather")
    # the environment's record is a real other build: the root's .venv (parallel HDF5) differs
    mine = subprocess.run(
        [sys.executable, "-m", "hpcbench.rank.linkage", "check", str(venv / linkage.BUILD_RECORD)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    record = json.loads((venv / linkage.BUILD_RECORD).read_text())
    import h5py

    if h5py.get_config().mpi:
        assert mine.returncode == 1, mine.stdout + mine.stderr
        reason = mine.stdout.strip()
        assert f"built with HDF5 {record['hdf5_version']} (serial)" in reason
        assert f"this rank loads HDF5 {h5py.version.hdf5_version} (parallel)" in reason


def test_without_mpi_setup_names_what_is_missing_and_creates_nothing(site: Site) -> None:
    venv = site.home / "venvs" / "none"
    proc, _ = site.setup(venv, site.env(without_mpi=True))
    assert proc.returncode == 1
    error = last_line(proc)
    assert error.startswith("[setup] error: no MPI found (MPICC is not set; no mpicc, mpirun or mpiexec on PATH): ")
    for way in ("module load openmpi", "spack load openmpi", "MPICC=", "as root"):
        assert way in error
    assert not venv.exists()


def test_as_root_apt_can_be_turned_off(site: Site, tmp_path: Path) -> None:
    """Root with apt-get, no MPI on PATH and HPCBENCH_APT=0: the same error, no apt-get."""
    env = {**site.env(without_mpi=True), "HOME": str(tmp_path), "HPCBENCH_APT": "0"}
    proc = subprocess.run(
        ["bash", str(ROOT / "envs" / "setup.sh"), str(tmp_path / "venv")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 1
    assert last_line(proc).startswith("[setup] error: no MPI found"), proc.stderr
    assert "apt-get install" not in proc.stderr.replace(last_line(proc), "")
    assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"HDF5_DIR": "{home}/site"}, "HDF5_DIR={home}/site holds no HDF5 (expected include/H5pubconf.h"),
        ({"MPICC": "{home}/no-such-mpicc"}, "MPICC={home}/no-such-mpicc is not an executable"),
        ({"HPCBENCH_REQUIREMENTS": "{home}/none.txt"}, "HPCBENCH_REQUIREMENTS={home}/none.txt is not a file"),
    ],
)
def test_bad_settings_are_refused_in_one_line(site: Site, variables: dict[str, str], message: str) -> None:
    venv = site.home / "venvs" / "bad"
    given = {k: v.format(home=site.home) for k, v in variables.items()}
    proc, _ = site.setup(venv, site.env(extra=given))
    assert proc.returncode == 1
    assert last_line(proc).startswith("[setup] error: " + message.format(home=site.home)), proc.stderr
    assert not venv.exists()


def test_the_installed_package_works_from_any_folder(installed: Installed) -> None:
    python, venv, elsewhere, run = installed.python, installed.venv, installed.elsewhere, installed.run
    tmp_path, purelib = installed.tmp, installed.purelib()
    where = run(python, "-c", "import hpcbench, os; print(os.path.realpath(hpcbench.__file__))")
    assert where.stdout.strip() == str(purelib.resolve() / "hpcbench" / "__init__.py"), where.stderr
    # the shipped site profiles are package data: a dry run shows the example's container prefix
    spec = elsewhere / "spec.yaml"
    spec.write_text(
        "name: t\nexecutor: local\nprofile: infiniband-example\nmatrix:\n  ranks_per_node: [1]\n"
        "fixed: {framework: synthetic, backend: none, launcher: mpirun, model: sleep, iterations: 4, warmup: 1}\n"
    )
    dry = run(venv / "bin" / "hpcbench", "run", spec, "--out", elsewhere / "out", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "apptainer exec --nv --bind /scratch /images/hpcbench.sif" in dry.stdout
    profiles = run(python, "-c", "from hpcbench.plan import profiles; print(profiles.available())")
    for name in ("generic", "infiniband-example", "testcluster"):
        assert f"'{name}'" in profiles.stdout, profiles.stderr
    # hpcbench check: this interpreter, and the environments in the user's data folder
    check = run(venv / "bin" / "hpcbench", "check")
    assert check.returncode == 0, check.stderr
    lines = [" ".join(line.split()) for line in check.stdout.splitlines()]
    assert f"{venv.name} {python} (Python " in "\n".join(lines)
    data_envs = tmp_path / "data" / "hpcbench" / "envs"
    command = f"HPCBENCH_ENVS_DIR={data_envs} bash envs/build.sh modern (in a source checkout)"
    assert f"modern not built: {command} (looked in {data_envs / 'modern'})" in lines
    mine = tmp_path / "my-envs"
    chosen = run(venv / "bin" / "hpcbench", "check", HPCBENCH_ENVS_DIR=str(mine))
    assert f"(looked in {mine / 'legacy'})" in chosen.stdout, chosen.stderr
