"""From a spec file to points and their launch commands, checked against the registries."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hpcbench.errors import HpcbenchError, SpecError
from hpcbench.frameworks import FRAMEWORKS
from hpcbench.launchers import LAUNCHERS, LaunchContext
from hpcbench.launchers.base import THREAD_VARIABLES, threads_per_rank
from hpcbench.plan import envs, profiles
from hpcbench.plan.profiles import SiteProfile
from hpcbench.spec import OptionsParser, Point, Sweep, load_sweep
from hpcbench.sweepdir.layout import SweepDir

Executors = Mapping[str, "OptionsParser | None"]  # a string: the caffe environment's Python 3.9 probes this
"""The registered executors as the plan sees them: name -> the parser of its options
section (None for one without options). The plan sits below the executors, so whoever loads
a spec hands them in (`hpcbench.executors.catalog()`)."""

# What only a running batch job knows stands in its planned launch as a slot, "\0name\0" (no
# argument or value can hold a NUL byte, so a slot is never taken for anything else, and one
# left unfilled cannot run): the rendezvous host:port on the job's first node, the job's hosts
# (host1, host2, ...) and, for a launcher started in the job, its ranks' threads, sized by the
# cores of the node it runs on. Plans show the stand-ins; the job fills in its own values.
RENDEZVOUS = "rendezvous"
THREADS = "threads"
JOB_TIME_RENDEZVOUS = "FIRST_NODE:29400"
_SLOT = re.compile("\0([^\0]*)\0")


def choices(executors: Executors) -> dict[str, list[str]]:
    """Allowed values of the registry-backed point fields."""
    frameworks = list(FRAMEWORKS)
    return {
        "executor": sorted(executors),
        "framework": FRAMEWORKS.names(),
        "launcher": LAUNCHERS.names(),
        "model": sorted({m for f in frameworks for m in f.models}),
        "dataset": sorted({d for f in frameworks for d in f.datasets}),
        "env": list(envs.NAMES),
    }


def check_point(point: Point) -> Iterable[tuple[str, str, str]]:
    """A point's problems: its framework's, its launcher's, and whether that launcher gives the
    point's backend what it needs (MPI ranks, or Horovod's: `Framework.launcher_needs` against
    `Launcher.mpi` and `Launcher.horovod`; the allowed launchers listed from the registry)."""
    framework, launcher = FRAMEWORKS.get(point.framework), LAUNCHERS.get(point.launcher)
    yield from framework.check_point(point)
    yield from launcher.check_point(point)
    yield from framework.check_launcher(point, launcher, LAUNCHERS)


def sections(executors: Executors) -> dict[str, OptionsParser]:
    return {name: parse for name, parse in executors.items() if parse is not None}


def parse_sweep(text: str, executors: Executors) -> Sweep:
    """A spec checked against every registry: names, backends, launchers, executor options."""
    return load_sweep(text, choices(executors), check_point, sections(executors))


def load_text(text: str, executors: Executors) -> tuple[Sweep, SiteProfile]:
    sweep = parse_sweep(text, executors)
    return sweep, profiles.load(sweep.profile, sections(executors))


def load(spec_path: Path, executors: Executors) -> tuple[Sweep, SiteProfile]:
    try:
        text = spec_path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(str(spec_path), f"cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise SpecError(str(spec_path), "is not UTF-8 text") from None
    return load_text(text, executors)


def slot(name: str) -> str:
    """How slot `name` stands in an argument or value."""
    return f"\0{name}\0"


def host_name(index: int) -> str:
    """The name of the slot of the job's `index`-th host (from 1)."""
    return f"host{index}"


@dataclass(frozen=True)
class Launch:
    """A point's launch, built once by the plan and carried to the executor and, as JSON, into
    its batch job: the argv that starts the point's ranks and the variables added to the
    submitting environment, with slots for what only the job knows (`bind`)."""

    point: Point
    argv: list[str]
    env: dict[str, str]  # added to the submitting environment
    run_file: str
    standins: dict[str, str] = field(default_factory=dict)  # what plans show in the slots

    def bind(self, values: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
        """The argv and environment with every slot filled from `values`."""

        def value(match: re.Match[str]) -> str:
            if match.group(1) not in values:
                raise HpcbenchError(
                    f"point {self.point.id}: its launch needs the job's {match.group(1)}, not known here"
                )
            return values[match.group(1)]

        return [_SLOT.sub(value, a) for a in self.argv], {k: _SLOT.sub(value, v) for k, v in self.env.items()}

    def shown(self) -> tuple[list[str], dict[str, str]]:
        """The argv and environment as plans show them: stand-ins in the slots."""
        return self.bind(self.standins)

    def to_json(self) -> str:
        data = {"point": self.point.as_dict(), "argv": self.argv, "env": self.env, "run_file": self.run_file}
        return json.dumps({**data, "standins": self.standins}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Launch:
        d = json.loads(text)
        return cls(Point.from_dict(d["point"]), list(d["argv"]), dict(d["env"]), d["run_file"], dict(d["standins"]))


def job_values(point: Point, hosts: Sequence[str], rendezvous: str, cores_per_node: int) -> dict[str, str]:
    """What a running job fills its launch's slots with."""
    values = {host_name(i): host for i, host in enumerate(hosts, start=1)}
    threads = threads_per_rank(point, LaunchContext(python="", run_file="", cores_per_node=cores_per_node))
    return {**values, RENDEZVOUS: rendezvous, THREADS: str(threads)}


def context(
    point: Point, sweep_dir: Path, profile: SiteProfile, local: bool, rendezvous: str | None, hosts: tuple[str, ...]
) -> LaunchContext:
    return LaunchContext(
        python=str(envs.python(point.env)),
        run_file=str(SweepDir(sweep_dir).run_file(point.id)),
        local=local,
        rendezvous=rendezvous,
        hosts=hosts,
        srun_args=profile.srun_args,
        mpirun_args=profile.mpirun_args,
        container=profile.container,
        forward_env=tuple(name for name, _ in profile.env),
    )


def launch_for(point: Point, sweep_dir: Path, profile: SiteProfile, local: bool) -> Launch:
    """The point's launch, built once: run on this host (`local`) or in a batch job, whose
    job-time values stand in it as slots. The point's `environ` wins over the profile's `env`,
    which wins over the launcher's."""
    launcher = LAUNCHERS.get(point.launcher)()
    if local:
        standins: dict[str, str] = {}
        ctx = context(point, sweep_dir, profile, local, None, ())
    else:
        hosts = [host_name(i) for i in range(1, point.nodes + 1)]
        standins = {RENDEZVOUS: JOB_TIME_RENDEZVOUS, **{h: f"NODE{i}" for i, h in enumerate(hosts, start=1)}}
        ctx = context(point, sweep_dir, profile, local, slot(RENDEZVOUS), tuple(slot(h) for h in hosts))
    env = launcher.environment(point, ctx)
    if not local and launcher.tasks != "rank":  # the launcher runs on a node of the job: its cores count
        standins[THREADS] = here = str(threads_per_rank(point, ctx))
        env.update({name: slot(THREADS) for name in THREAD_VARIABLES if env.get(name) == here})
    env.update(profile.env)
    env.update(point.environ)
    return Launch(point, launcher.command(point, ctx), env, ctx.run_file, standins)
