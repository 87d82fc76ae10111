"""hpcbench.executors.slurm.executor, the parts that need no Slurm: job names, job parameters, grouping, sbatch text.

`refresh` and `sacct_runs` run sacct and are covered by the tests against the test cluster.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from hpcbench.errors import HpcbenchError
from hpcbench.executors.slurm import executor as slurm
from hpcbench.executors.slurm.options import SlurmOptions, parse
from hpcbench.plan import launch as plan
from hpcbench.plan import profiles
from hpcbench.plan.launch import Launch
from hpcbench.plan.profiles import SiteProfile
from hpcbench.spec import Point
from hpcbench.store.schema import STATUS_STOPPED
from hpcbench.sweepdir import manifest as mf
from hpcbench.sweepdir.manifest import Entry

SWEEP_DIR = Path("/tmp/x")
FOLDER = Path("/tmp/x/slurm/dry-run/%j")
SAFE_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")

# A profile with everything that reaches a job, written here rather than read from the shipped profiles.
SITE = SiteProfile(
    name="site",
    path="site.yaml",
    modules=("gcc/12", "open mpi/4"),
    setup=("source /etc/profile",),
    env=(("NCCL_DEBUG", "INFO"),),
    srun_args=("--mpi=pmix_v4", "--cpu-bind=cores"),
    mpirun_args=("--bind-to", "none"),
    slurm=(("partition", "debug"), ("time", 10), ("signal_delay_s", 5)),
)


@pytest.fixture(autouse=True)
def _no_extra_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPCBENCH_PROFILES", raising=False)


def defaults(profile: SiteProfile, sweep_slurm: Mapping[str, Any] | None = None) -> SlurmOptions:
    """What SlurmExecutor._defaults builds: profile, then the sweep's `slurm:` section."""
    return SlurmOptions().merged(dict(profile.slurm)).merged(parse("slurm", sweep_slurm or {}))


def params_for(
    point: Point, profile: SiteProfile = SITE, sweep_slurm: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    return slurm.job_parameters(point, "sweep", defaults(profile, sweep_slurm), profile)


def launch(point: Point, profile: SiteProfile = SITE) -> Launch:
    return plan.launch_for(point, SWEEP_DIR, profile, local=False)


def sbatch_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH ")]


def setup_section(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index("# setup") + 1
    end = lines.index("# command")
    return [line for line in lines[start:end] if line]


# --------------------------------------------------------------------------------------
# job_name


@pytest.mark.parametrize(
    ("sweep", "expected"),
    [
        ("quickstart", "quickstart"),
        ("scaling-v2.1_final", "scaling-v2.1_final"),
        ("my sweep", "my_sweep"),
        ("a  b\tc", "a_b_c"),
        ("a'; rm -rf /\n$(x)", "a_rm_-rf_x"),
        ("..hidden..", "hidden"),
        ("__x__", "x"),
        ("ünïcode", "n_code"),
    ],
)
def test_job_name(sweep: str, expected: str) -> None:
    assert slurm.job_name(sweep) == expected


@pytest.mark.parametrize(
    "sweep",
    [
        "",
        " ",
        "...",
        "___",
        "$()",
        "'\"",
        "\n",
        "\x00",
        "a'; rm -rf /\n$(x)",
        "x" * 500,
        "é" * 100,
        "a" * 63 + "$" + "b" * 10,
        "--job-name=evil",
        "#SBATCH --nodes=100",
    ],
)
def test_job_name_is_always_safe(sweep: str) -> None:
    name = slurm.job_name(sweep)
    assert SAFE_NAME.match(name), name
    assert len(name) <= 64
    assert name  # never empty


def test_job_name_of_nothing_safe_is_a_default() -> None:
    assert slurm.job_name("") == slurm.job_name("!!!") == slurm.job_name("...")
    assert slurm.job_name("") != ""


def test_job_name_keeps_the_first_64_characters() -> None:
    assert slurm.job_name("a" * 100) == "a" * 64
    assert slurm.job_name("ab" * 40) == ("ab" * 40)[:64]


# --------------------------------------------------------------------------------------
# check_path


@pytest.mark.parametrize(
    "directory", ["/scratch/my sweep", "/scratch/it's", "/scratch/a;b", "/scratch/$(id)", "/s/`x`", '/s/"q"', "rel/x"]
)
def test_check_path_accepts_shell_characters(directory: str) -> None:
    slurm.check_path(Path(directory))  # quoting is the script writer's job; these are fine


@pytest.mark.parametrize("directory", ["/scratch/a\nb", "/scratch/a\rb", "/s/tab\there", "/s/\x1b[0m", "/s/\x7f"])
def test_check_path_refuses_control_characters(directory: str) -> None:
    with pytest.raises(HpcbenchError) as info:
        slurm.check_path(Path(directory))
    message = str(info.value)
    assert "control character" in message
    assert repr(directory) in message


# --------------------------------------------------------------------------------------
# job_parameters


def test_srun_launcher_one_task_per_rank() -> None:
    p = params_for(Point(launcher="srun", nodes=2, ranks_per_node=4))
    assert p["nodes"] == 2
    assert p["ntasks_per_node"] == 4
    assert p["use_srun"] is True
    assert p["srun_args"] == ["--mpi=pmix_v4", "--cpu-bind=cores"]
    assert "gpus_per_node" not in p


def test_torchrun_launcher_one_task_per_node() -> None:
    p = params_for(Point(launcher="torchrun", nodes=3, ranks_per_node=4))
    assert p["nodes"] == 3
    assert p["ntasks_per_node"] == 1
    assert p["use_srun"] is True
    assert "--mpi=pmix_v4" not in p.get("srun_args", [])


def test_mpirun_launcher_runs_in_the_batch_step() -> None:
    p = params_for(Point(launcher="mpirun", nodes=2, ranks_per_node=3))
    assert p["nodes"] == 2
    assert p["ntasks_per_node"] == 3
    assert p["use_srun"] is False


def test_horovodrun_launcher_runs_in_the_batch_step() -> None:
    p = params_for(Point(launcher="horovodrun", framework="torch", nodes=2, ranks_per_node=2))
    assert p["ntasks_per_node"] == 2
    assert p["use_srun"] is False


@pytest.mark.parametrize("launcher", ["srun", "torchrun", "mpirun"])
def test_cuda_asks_one_gpu_per_rank(launcher: str) -> None:
    p = params_for(Point(launcher=launcher, device="cuda", backend="nccl", nodes=2, ranks_per_node=4))
    assert p["gpus_per_node"] == 4
    cpu = params_for(Point(launcher=launcher, device="cpu", nodes=2, ranks_per_node=4))
    assert "gpus_per_node" not in cpu


def test_job_parameters_basics() -> None:
    p = slurm.job_parameters(Point(), "my sweep!", defaults(profiles.load("generic")), profiles.load("generic"))
    assert p["job_name"] == "my_sweep"
    assert p["time"] == 30
    assert p["signal_delay_s"] == 60
    assert p["array_parallelism"] == 64
    assert p["stderr_to_stdout"] is True
    assert p["setup"] == []
    assert p["additional_parameters"] == {}
    for unset in ("partition", "account", "qos", "constraint", "exclusive", "mem", "cpus_per_task"):
        assert unset not in p


def test_precedence_profile_then_sweep_then_point() -> None:
    profile = SiteProfile(
        name="p",
        path="p.yaml",
        slurm=(
            ("partition", "debug"),
            ("time", 10),
            ("signal_delay_s", 5),
            ("qos", "low"),
            ("additional", (("comment", "profile"), ("mail-type", "END"))),
        ),
    )
    sweep_slurm = {"time": "0:20:00", "account": "proj", "qos": "normal", "additional": {"comment": "sweep"}}
    point = Point(slurm=(("additional", (("mail-user", "me@x"),)), ("qos", "high"), ("time", 30)))
    p = params_for(point, profile, sweep_slurm)
    assert p["partition"] == "debug"  # profile only
    assert p["signal_delay_s"] == 5  # profile only
    assert p["account"] == "proj"  # sweep only
    assert p["qos"] == "high"  # point over sweep over profile
    assert p["time"] == 30
    assert p["additional_parameters"] == {"comment": "sweep", "mail-type": "END", "mail-user": "me@x"}

    # without the point's override, the sweep wins over the profile
    q = params_for(Point(), profile, sweep_slurm)
    assert q["time"] == 20
    assert q["qos"] == "normal"
    assert q["additional_parameters"] == {"comment": "sweep", "mail-type": "END"}
    # and with neither, the profile's values
    r = params_for(Point(), profile)
    assert (r["time"], r["qos"], r["partition"]) == (10, "low", "debug")


def test_all_options_reach_the_parameters() -> None:
    sweep_slurm = {
        "partition": "gpu",
        "account": "acc",
        "qos": "q",
        "constraint": "a100",
        "exclusive": True,
        "mem": "64G",
        "cpus_per_task": 6,
        "array_parallelism": 3,
        "signal_delay_s": 30,
        "time": "1-00:00:00",
    }
    p = params_for(Point(), profiles.load("generic"), sweep_slurm)
    assert p["partition"] == "gpu"
    assert p["account"] == "acc"
    assert p["qos"] == "q"
    assert p["constraint"] == "a100"
    assert p["exclusive"] is True
    assert p["mem"] == "64G"
    assert p["cpus_per_task"] == 6
    assert p["array_parallelism"] == 3
    assert p["signal_delay_s"] == 30
    assert p["time"] == 24 * 60


def test_profile_setup_comes_before_option_setup() -> None:
    sweep_slurm = {"setup": ["echo sweep"]}
    p = params_for(Point(), SITE, sweep_slurm)
    assert p["setup"][0].startswith("module load ")
    assert shlex.split(p["setup"][0]) == ["module", "load", "gcc/12", "open mpi/4"]
    assert p["setup"][1:] == ["source /etc/profile", "echo sweep"]
    # a point's own setup replaces the sweep's, still after the profile's
    point = Point(slurm=(("setup", ("echo point",)),))
    assert params_for(point, SITE, sweep_slurm)["setup"][1:] == ["source /etc/profile", "echo point"]


def test_job_parameters_do_not_change_defaults() -> None:
    d = defaults(SITE, {"additional": {"comment": "x"}})
    before = d
    slurm.job_parameters(Point(slurm=(("additional", (("mail-type", "END"),)),)), "s", d, SITE)
    assert d == before
    assert d.additional == (("comment", "x"),)


# --------------------------------------------------------------------------------------
# groups and chunks


def test_points_differing_only_in_seed_share_one_group() -> None:
    launches = [launch(Point(launcher="srun", nodes=2, ranks_per_node=2, seed=s)) for s in range(5)]
    out = slurm.groups(launches, "sweep", defaults(SITE), SITE)
    assert len(out) == 1
    params, items = out[0]
    assert items == launches
    assert params == params_for(launches[0].point)


def test_points_with_other_shapes_get_their_own_groups_in_first_seen_order() -> None:
    pts = [
        Point(launcher="srun", nodes=2, seed=0),
        Point(launcher="srun", nodes=1, seed=0),
        Point(launcher="srun", nodes=2, seed=1),
        Point(launcher="srun", nodes=4, seed=0),
        Point(launcher="srun", nodes=1, seed=1),
        Point(launcher="srun", nodes=2, model="mlp"),
    ]
    launches = [launch(p) for p in pts]
    out = slurm.groups(launches, "sweep", defaults(SITE), SITE)
    assert [params["nodes"] for params, _ in out] == [2, 1, 4]
    assert [[x.point for x in items] for _, items in out] == [
        [pts[0], pts[2], pts[5]],
        [pts[1], pts[4]],
        [pts[3]],
    ]


def test_slurm_override_device_and_launcher_split_groups() -> None:
    pts = [
        Point(launcher="srun"),
        Point(launcher="srun", slurm=(("time", 99),)),
        Point(launcher="srun", device="cuda", backend="nccl"),
        Point(launcher="mpirun"),
        Point(launcher="srun", ranks_per_node=2),
        Point(launcher="srun", seed=7),
    ]
    out = slurm.groups([launch(p) for p in pts], "sweep", defaults(SITE), SITE)
    assert len(out) == 5
    assert [len(items) for _, items in out] == [2, 1, 1, 1, 1]
    assert out[1][0]["time"] == 99


def test_groups_of_nothing() -> None:
    assert slurm.groups([], "sweep", defaults(SITE), SITE) == []


def test_chunks() -> None:
    launches = [launch(Point(seed=s)) for s in range(7)]
    parts = [list(c) for c in slurm.chunks(launches, 3)]
    assert [len(c) for c in parts] == [3, 3, 1]
    assert [x for c in parts for x in c] == launches
    assert [list(c) for c in slurm.chunks(launches, 7)] == [launches]
    assert [list(c) for c in slurm.chunks(launches, 100)] == [launches]
    assert [len(c) for c in slurm.chunks(launches, 1)] == [1] * 7
    assert list(slurm.chunks([], 5)) == []


# --------------------------------------------------------------------------------------
# sbatch_text


def text_for(
    point: Point, count: int, profile: SiteProfile = SITE, sweep_slurm: Mapping[str, Any] | None = None
) -> str:
    return slurm.sbatch_text(params_for(point, profile, sweep_slurm), FOLDER, count)


def test_sbatch_array_for_several_points() -> None:
    text = text_for(Point(launcher="srun", nodes=2, ranks_per_node=4), 5)
    (array,) = [line for line in sbatch_lines(text) if line.startswith("#SBATCH --array=")]
    m = re.fullmatch(r"#SBATCH --array=0-4%(\d+)", array)
    assert m is not None, array
    assert 1 <= int(m.group(1)) <= 64


def test_sbatch_array_throttle_follows_array_parallelism() -> None:
    text = text_for(Point(), 10, sweep_slurm={"array_parallelism": 2})
    assert "#SBATCH --array=0-9%2" in sbatch_lines(text)


def test_sbatch_one_point_has_no_array() -> None:
    text = text_for(Point(launcher="srun", nodes=2, ranks_per_node=4), 1)
    assert not any("--array" in line for line in text.splitlines())


def test_sbatch_resource_lines() -> None:
    lines = sbatch_lines(text_for(Point(launcher="srun", nodes=2, ranks_per_node=4), 3))
    assert "#SBATCH --nodes=2" in lines
    assert "#SBATCH --ntasks-per-node=4" in lines
    assert "#SBATCH --job-name=sweep" in lines
    assert "#SBATCH --partition=debug" in lines
    assert "#SBATCH --time=10" in lines
    assert not any(line.startswith("#SBATCH --gpus-per-node") for line in lines)


def test_sbatch_gpus_only_for_cuda() -> None:
    cuda = sbatch_lines(text_for(Point(launcher="srun", device="cuda", backend="nccl", nodes=2, ranks_per_node=4), 1))
    assert "#SBATCH --gpus-per-node=4" in cuda
    torchrun = sbatch_lines(
        text_for(Point(launcher="torchrun", device="cuda", backend="nccl", nodes=2, ranks_per_node=8), 1)
    )
    assert "#SBATCH --gpus-per-node=8" in torchrun
    assert "#SBATCH --ntasks-per-node=1" in torchrun
    cpu = sbatch_lines(text_for(Point(launcher="srun", nodes=2, ranks_per_node=4), 1))
    assert not any("gpus" in line for line in cpu)


def test_sbatch_setup_section_has_module_load_first() -> None:
    text = text_for(Point(launcher="srun"), 2, sweep_slurm={"setup": ["echo ready"]})
    setup = setup_section(text)
    assert shlex.split(setup[0]) == ["module", "load", "gcc/12", "open mpi/4"]
    assert setup[1:] == ["source /etc/profile", "echo ready"]


def test_sbatch_infiniband_profile() -> None:
    ib = profiles.load("infiniband-example")
    text = text_for(Point(launcher="srun", device="cuda", backend="nccl", nodes=2, ranks_per_node=4), 1, ib)
    assert setup_section(text) == ["module load gcc/12.2 openmpi/4.1.5 cuda/12.4"]
    assert "#SBATCH --exclusive" in sbatch_lines(text)
    srun_line = next(line for line in text.splitlines() if line.startswith("srun "))
    assert "--mpi=pmix --cpu-bind=cores" in srun_line


def test_sbatch_srun_only_for_task_launchers() -> None:
    srun_text = text_for(Point(launcher="srun"), 1)
    assert any(line.startswith("srun ") and "--mpi=pmix_v4" in line for line in srun_text.splitlines())
    mpirun_text = text_for(Point(launcher="mpirun"), 1)
    assert not any(line.startswith("srun ") for line in mpirun_text.splitlines())


def test_sbatch_options_and_additional() -> None:
    sweep_slurm = {
        "account": "proj",
        "mem": "16G",
        "cpus_per_task": 4,
        "signal_delay_s": 90,
        "additional": {"mail-type": "END", "comment": "a b"},
    }
    lines = sbatch_lines(text_for(Point(), 1, sweep_slurm=sweep_slurm))
    assert "#SBATCH --account=proj" in lines
    assert "#SBATCH --mem=16G" in lines
    assert "#SBATCH --cpus-per-task=4" in lines
    assert "#SBATCH --mail-type=END" in lines
    assert "#SBATCH --comment='a b'" in lines
    assert any(re.fullmatch(r"#SBATCH --signal=(B:)?USR2@90", line) for line in lines)


def test_sbatch_exclusive_false_is_not_written_as_an_option_value() -> None:
    # `exclusive: false` in a spec (e.g. to undo a profile's `exclusive: true`) must not become
    # `#SBATCH --exclusive=False`: sbatch accepts only --exclusive[=user|mcs|topo].
    ib = profiles.load("infiniband-example")
    text = text_for(Point(), 1, ib, {"exclusive": False})
    assert not any("--exclusive" in line for line in sbatch_lines(text))


def test_sbatch_hostile_sweep_name_stays_in_its_line() -> None:
    params = slurm.job_parameters(Point(), "a'; rm -rf /\n$(x)", defaults(SITE), SITE)
    lines = sbatch_lines(slurm.sbatch_text(params, FOLDER, 1))
    (name_line,) = [line for line in lines if line.startswith("#SBATCH --job-name=")]
    assert SAFE_NAME.match(name_line.removeprefix("#SBATCH --job-name="))


def test_job_states_trust_the_queue_right_after_a_requeue() -> None:
    assert slurm.job_states(["RUNNING"], None) == ["RUNNING"]
    assert slurm.job_states(["PENDING"], "RUNNING") == ["RUNNING"]  # sacct lags behind the queue
    assert slurm.job_states(["NODE_FAIL"], "PENDING") == ["NODE_FAIL", "PENDING"]  # requeued, no new record yet
    assert slurm.job_states(["REQUEUED", "PENDING"], "RUNNING") == ["REQUEUED", "RUNNING"]
    assert slurm.job_states(["NODE_FAIL", "COMPLETED"], None) == ["NODE_FAIL", "COMPLETED"]
    assert slurm.job_states([], "PENDING") == ["PENDING"]
    assert slurm.job_states([], None) == []


def test_a_job_gone_from_the_queue_waits_for_sacct_to_record_its_end(tmp_path: Path) -> None:
    entry = Entry(id="p", label="p", point={}, state=mf.RUNNING, job_id="7", log=str(tmp_path / "7_0_log.out"))
    started = [slurm.Run("RUNNING", None)]
    # sacct still says running (or pending) while the queue no longer holds the job: no verdict
    # yet, and a stopped file is not taken for a requeued run
    for stale in ("RUNNING", "PENDING", "REQUEUED"):
        assert slurm._verdict(entry, [slurm.Run(stale, None)], None, STATUS_STOPPED, "signal 15 (SIGTERM)") is None
    running = slurm._verdict(entry, started, "RUNNING", None)
    assert running is not None
    assert (running.state, running.reason) == (mf.RUNNING, "")
    # once recorded, the ranks' reason is kept (FAILED: the ranks' stop exit code)
    ended = [slurm.Run("FAILED", None)]
    stopped = slurm._verdict(entry, ended, None, STATUS_STOPPED, "signal 15 (SIGTERM)")
    assert stopped is not None
    assert (stopped.state, stopped.stop, stopped.slurm_state) == (mf.STOPPED, "signal 15 (SIGTERM)", "FAILED")
    assert stopped.reason == f"signal 15 (SIGTERM); see {entry.log}"
    # a real requeue: the queue holds the job pending again, after a recorded run
    requeued = slurm._verdict(entry, [slurm.Run("REQUEUED", None)], "PENDING", STATUS_STOPPED)
    assert requeued is not None
    assert (requeued.state, requeued.requeued_after) == (mf.QUEUED, ("REQUEUED",))
    assert requeued.reason == "requeued 1x after REQUEUED"


LOG = "/s/slurm/submission-001/7/7_0_log.out"


@pytest.mark.parametrize(
    ("verdict", "reason"),
    [
        (slurm.Verdict(mf.QUEUED, "PENDING"), ""),
        (slurm.Verdict(mf.RUNNING, "RUNNING", ("NODE_FAIL", "PREEMPTED")), "requeued 2x after NODE_FAIL, PREEMPTED"),
        (slurm.Verdict(mf.DONE, "COMPLETED", result="complete"), ""),
        (slurm.Verdict(mf.DONE, "COMPLETED", ("NODE_FAIL",)), "completed, requeued 1x after NODE_FAIL"),
        (slurm.Verdict(mf.STOPPED, "CANCELLED", stop="cancelled", log=LOG), f"cancelled; see {LOG}"),
        (
            slurm.Verdict(mf.STOPPED, "PREEMPTED", ("NODE_FAIL",), stop="preempted", log=LOG),
            f"requeued 1x after NODE_FAIL, then preempted; see {LOG}",
        ),
        (
            slurm.Verdict(mf.FAILED, "COMPLETED", result="running", log=LOG),
            f"job completed but result is running; see {LOG}",
        ),
        (slurm.Verdict(mf.FAILED, "COMPLETED", log=LOG), f"job completed but result is missing; see {LOG}"),
        (slurm.Verdict(mf.FAILED, "OUT_OF_MEMORY", log=LOG), f"Slurm state OUT_OF_MEMORY; see {LOG}"),
        (
            slurm.Verdict(mf.FAILED, "TIMEOUT", ("REQUEUED",), hint="rank 1: MemoryError", log=LOG),
            f"requeued 1x after REQUEUED, then Slurm state TIMEOUT: rank 1: MemoryError; see {LOG}",
        ),
    ],
)
def test_a_verdict_says_in_one_sentence_what_its_data_holds(verdict: slurm.Verdict, reason: str) -> None:
    assert verdict.reason == reason


def test_the_stop_reason_comes_from_the_data_not_from_the_sentence(tmp_path: Path) -> None:
    # a log path holding the words the sentence is made of cannot garble what the file is told
    entry = Entry(id="p", label="p", point={}, state=mf.RUNNING, job_id="7", log="/s/a, then b; see c/7_0_log.out")
    runs = [slurm.Run("NODE_FAIL", None), slurm.Run("CANCELLED", None)]
    verdict = slurm._verdict(entry, runs, None, STATUS_STOPPED, "signal 15 (SIGTERM)")
    assert verdict is not None
    assert (verdict.state, verdict.stop, verdict.requeued_after) == (mf.STOPPED, "cancelled", ("NODE_FAIL",))
    assert verdict.reason == f"requeued 1x after NODE_FAIL, then cancelled; see {entry.log}"


# --------------------------------------------------------------------------------------
# the launch: built once by the plan, carried into the job as JSON, its slots filled there


def test_a_launch_travels_as_json_unchanged() -> None:
    point = Point(launcher="horovodrun", framework="torch", nodes=3, ranks_per_node=2, environ=(("A", "b c"),))
    planned = launch(point)
    again = Launch.from_json(planned.to_json())
    assert again == planned
    assert again.point.id == point.id


def test_the_plan_shows_stand_ins_where_only_the_job_knows_the_values() -> None:
    torchrun = launch(Point(launcher="torchrun", nodes=2, ranks_per_node=4)).shown()[0]
    assert torchrun[torchrun.index("--rdzv-endpoint") + 1] == plan.JOB_TIME_RENDEZVOUS
    horovod = launch(Point(launcher="horovodrun", framework="torch", nodes=3, ranks_per_node=2)).shown()[0]
    assert horovod[horovod.index("-H") + 1] == "NODE1:2,NODE2:2,NODE3:2"
    assert not any("\0" in a for a in [*torchrun, *horovod])


def test_the_job_fills_in_its_hosts_rendezvous_and_threads() -> None:
    point = Point(launcher="horovodrun", framework="torch", nodes=2, ranks_per_node=2)
    planned = launch(point)
    assert planned.env["OMP_NUM_THREADS"] == plan.slot(plan.THREADS)  # sized on the node the launcher runs on
    argv, env = planned.bind(plan.job_values(point, ("n1", "n2"), "n1:20007", cores_per_node=16))
    assert argv[argv.index("-H") + 1] == "n1:2,n2:2"
    assert env["OMP_NUM_THREADS"] == "8"
    assert env["NCCL_DEBUG"] == "INFO"  # the profile's
    torchrun = launch(Point(launcher="torchrun", nodes=2, ranks_per_node=4))
    argv, _ = torchrun.bind(plan.job_values(torchrun.point, ("n1", "n2"), "10.0.0.1:20007", cores_per_node=8))
    assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.1:20007"


def test_a_slot_the_job_cannot_fill_is_an_error_not_a_wrong_command() -> None:
    planned = launch(Point(launcher="horovodrun", framework="torch", nodes=2, ranks_per_node=2))
    with pytest.raises(HpcbenchError, match="host2"):
        planned.bind(plan.job_values(planned.point, ("n1",), "n1:20000", cores_per_node=4))


def test_srun_and_local_launches_have_nothing_to_fill_in() -> None:
    srun = launch(Point(launcher="srun", nodes=2, ranks_per_node=2))
    assert srun.bind({}) == (srun.argv, srun.env)  # the planning host's threads, as ever
    local = plan.launch_for(Point(launcher="torchrun", ranks_per_node=2), SWEEP_DIR, SITE, local=True)
    assert local.standins == {}
    assert local.bind({}) == local.shown() == (local.argv, local.env)


def test_the_points_environ_wins_over_a_slot() -> None:
    point = Point(launcher="mpirun", nodes=2, environ=(("OMP_NUM_THREADS", "3"),))
    assert launch(point).env["OMP_NUM_THREADS"] == "3"
