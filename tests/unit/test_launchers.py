"""hpcbench.launchers: argv lists and environments of mpirun and torchrun."""

from __future__ import annotations

import shlex

import pytest

from hpcbench.errors import HpcbenchError, LaunchError
from hpcbench.launchers import LAUNCHERS, LaunchContext
from hpcbench.spec import Point

PY = "/opt/venv/bin/python"
RUN = "/scratch/sweep/points/0123456789ab.json"
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

HOSTILE_VALUES = [
    "a b c",
    "it's",
    'say "hi"',
    "x; rm -rf /",
    "$(touch /tmp/pwned)",
    "`id`",
    "line1\nline2",
    "-x EVIL",
    "${HOME}",
    "&& reboot |",
]


def command(launcher: str, point: Point, ctx: LaunchContext) -> list[str]:
    return LAUNCHERS.get(launcher)().command(point, ctx)


def test_both_launchers_are_registered() -> None:
    assert {"mpirun", "torchrun"} <= set(LAUNCHERS.names())


def test_unknown_launcher_lists_known_ones() -> None:
    with pytest.raises(HpcbenchError) as info:
        LAUNCHERS.get("aprun")
    assert "'aprun'" in str(info.value)
    assert "mpirun" in str(info.value)
    assert "torchrun" in str(info.value)


def test_mpirun_local_argv() -> None:
    ctx = LaunchContext(python=PY, run_file=RUN, local=True, cores_per_node=8)
    assert command("mpirun", Point(ranks_per_node=2), ctx) == [
        "mpirun", "-n", "2", "--oversubscribe", "--bind-to", "none",
        "-x", "MKL_NUM_THREADS",
        "-x", "OMPI_ALLOW_RUN_AS_ROOT",
        "-x", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
        "-x", "OMP_NUM_THREADS",
        "-x", "OPENBLAS_NUM_THREADS",
        PY, "-m", "hpcbench.worker", RUN,
    ]  # fmt: skip


def test_mpirun_multi_node_argv_forwards_point_environ() -> None:
    ctx = LaunchContext(python=PY, run_file=RUN, local=False, cores_per_node=64)
    point = Point(nodes=2, ranks_per_node=4, environ=(("NCCL_DEBUG", "INFO"),))
    assert command("mpirun", point, ctx) == [
        "mpirun", "-n", "8", "--map-by", "ppr:4:node", "--bind-to", "none",
        "-x", "MKL_NUM_THREADS",
        "-x", "NCCL_DEBUG",
        "-x", "OMPI_ALLOW_RUN_AS_ROOT",
        "-x", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
        "-x", "OMP_NUM_THREADS",
        "-x", "OPENBLAS_NUM_THREADS",
        PY, "-m", "hpcbench.worker", RUN,
    ]  # fmt: skip


def test_torchrun_local_argv() -> None:
    ctx = LaunchContext(python=PY, run_file=RUN, local=True, cores_per_node=8)
    point = Point(launcher="torchrun", ranks_per_node=3)
    assert command("torchrun", point, ctx) == [
        PY, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc-per-node", "3", "--max-restarts", "0",
        "-m", "hpcbench.worker", RUN,
    ]  # fmt: skip


def test_torchrun_local_runs_every_rank_on_this_host() -> None:
    ctx = LaunchContext(python=PY, run_file=RUN, local=True, cores_per_node=8)
    argv = command("torchrun", Point(launcher="torchrun", nodes=2, ranks_per_node=2), ctx)
    assert argv[argv.index("--nproc-per-node") + 1] == "4"
    assert argv[argv.index("--nnodes") + 1] == "1"


def test_torchrun_multi_node_argv_counts() -> None:
    ctx = LaunchContext(python=PY, run_file=RUN, local=False, cores_per_node=8, rendezvous="c1:29400")
    argv = command("torchrun", Point(launcher="torchrun", nodes=2, ranks_per_node=4), ctx)
    assert argv[:3] == [PY, "-m", "torch.distributed.run"]
    assert argv[argv.index("--nnodes") + 1] == "2"
    assert argv[argv.index("--nproc-per-node") + 1] == "4"
    assert "--standalone" not in argv
    assert argv[-3:] == ["-m", "hpcbench.worker", RUN]


def test_torchrun_multi_node_names_a_rendezvous() -> None:
    # Without --rdzv-endpoint (or --master-addr/--node-rank) every node's torchrun agent
    # rendezvouses with itself on 127.0.0.1 as node 0 and the job never forms.
    point = Point(launcher="torchrun", nodes=2, ranks_per_node=4)
    ctx = LaunchContext(python=PY, run_file=RUN, local=False, cores_per_node=8)
    with pytest.raises(LaunchError, match="rendezvous"):
        command("torchrun", point, ctx)  # the job's first node is known only at run time
    ctx = LaunchContext(python=PY, run_file=RUN, local=False, cores_per_node=8, rendezvous="c1:29400")
    argv = command("torchrun", point, ctx)
    assert argv[argv.index("--rdzv-endpoint") + 1] == "c1:29400"
    assert argv[argv.index("--rdzv-backend") + 1] == "c10d"
    assert argv[argv.index("--nproc-per-node") + 1] == "4"
    assert argv[argv.index("--nnodes") + 1] == "2"


@pytest.mark.parametrize(
    ("cores", "ranks_per_node", "threads", "expected"),
    [
        (8, 1, None, "8"),
        (8, 3, None, "2"),
        (64, 4, None, "16"),
        (2, 4, None, "1"),  # never 0
        (8, 2, 3, "3"),  # the point's own choice wins
        (8, 8, 4, "4"),
    ],
)
@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
def test_thread_variables(cores: int, ranks_per_node: int, threads: int | None, expected: str, launcher: str) -> None:
    ctx = LaunchContext(python=PY, run_file=RUN, local=True, cores_per_node=cores)
    point = Point(launcher=launcher, ranks_per_node=ranks_per_node, threads=threads)
    env = LAUNCHERS.get(launcher)().environment(point, ctx)
    assert {name: env[name] for name in THREAD_VARS} == dict.fromkeys(THREAD_VARS, expected)
    assert all(isinstance(v, str) for v in env.values())


def test_mpirun_environment_allows_running_as_root() -> None:
    env = LAUNCHERS.get("mpirun")().environment(Point(), LaunchContext(PY, RUN, cores_per_node=4))
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    assert env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"


def test_environment_does_not_contain_point_environ_values() -> None:
    point = Point(environ=(("SECRET_THING", "v"),))
    env = LAUNCHERS.get("mpirun")().environment(point, LaunchContext(PY, RUN, cores_per_node=4))
    assert "SECRET_THING" not in env


def test_torchrun_refuses_other_frameworks() -> None:
    cls = LAUNCHERS.get("torchrun")
    problems = list(cls.check_point(Point(framework="tensorflow", launcher="torchrun")))
    assert len(problems) == 1
    field, problem, allowed = problems[0]
    assert field == "launcher"
    assert "tensorflow" in problem
    assert "torch" in allowed
    assert list(cls.check_point(Point(framework="torch", launcher="torchrun"))) == []


def test_mpirun_accepts_any_framework() -> None:
    cls = LAUNCHERS.get("mpirun")
    assert list(cls.check_point(Point(framework="tensorflow"))) == []
    assert list(cls.check_point(Point(framework="horovod"))) == []


@pytest.mark.parametrize("local", [True, False])
def test_hostile_environ_values_never_reach_argv(local: bool) -> None:
    environ = tuple(sorted((f"V{i}", value) for i, value in enumerate(HOSTILE_VALUES)))
    point = Point(ranks_per_node=2, environ=environ)
    ctx = LaunchContext(python=PY, run_file=RUN, local=local, cores_per_node=4)
    argv = command("mpirun", point, ctx)
    for name, value in environ:
        i = argv.index(name)
        assert argv[i - 1] == "-x"  # forwarded by name only: `-x NAME`, never `-x NAME=value`
        assert not any(value in token for token in argv)
    assert not any("=" in token for token in argv)
    assert argv[-4:] == [PY, "-m", "hpcbench.worker", RUN]


@pytest.mark.parametrize(
    "run_file",
    [
        "/tmp/my sweep/points/abc.json",
        '/tmp/it\'s "quoted"/points/abc.json',
        "/tmp/a;b && c | d/points/abc.json",
        "/tmp/new\nline/$(id)/`x`/points/abc.json",
        "-rf",
    ],
)
@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
@pytest.mark.parametrize("local", [True, False])
def test_argv_survives_shell_quoting(run_file: str, launcher: str, local: bool) -> None:
    ctx = LaunchContext(
        python="/opt/my env/bin/python", run_file=run_file, local=local, cores_per_node=4, rendezvous="c1:29400"
    )
    argv = command(launcher, Point(launcher=launcher, nodes=1, ranks_per_node=2), ctx)
    assert all(isinstance(token, str) for token in argv)
    assert argv[-1] == run_file  # one argument, exactly as given
    assert "/opt/my env/bin/python" in argv
    assert shlex.split(shlex.join(argv)) == argv


def test_worker_argv() -> None:
    ctx = LaunchContext(python=PY, run_file=RUN)
    assert ctx.worker_argv() == [PY, "-m", "hpcbench.worker", RUN]
    assert ctx.local is True
    assert ctx.cores_per_node >= 1
