"""From a spec file to points and their launch commands, checked against the registries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hpcbench.errors import SpecError
from hpcbench.frameworks import FRAMEWORKS
from hpcbench.launchers import LAUNCHERS, LaunchContext
from hpcbench.plan import envs, profiles
from hpcbench.plan.profiles import SiteProfile
from hpcbench.spec import OptionsParser, Point, Sweep, load_sweep
from hpcbench.sweepdir.layout import SweepDir

Executors = Mapping[str, OptionsParser | None]
"""The registered executors as the plan sees them: name -> the parser of its options
section (None for one without options). The plan sits below the executors, so whoever loads
a spec hands them in (`hpcbench.executors.catalog()`)."""

# Stand-ins shown by plans and dry runs for what a batch job learns only once it runs.
JOB_TIME_RENDEZVOUS = "FIRST_NODE:29400"
JOB_TIME_HOSTS = ("NODE1", "NODE2")


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
    yield from FRAMEWORKS.get(point.framework).check_point(point)
    yield from LAUNCHERS.get(point.launcher).check_point(point)


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


@dataclass(frozen=True)
class Launch:
    point: Point
    argv: list[str]
    env: dict[str, str]  # added to the submitting environment
    run_file: str


def context(
    point: Point,
    sweep_dir: Path,
    profile: SiteProfile,
    local: bool,
    rendezvous: str | None = None,
    hosts: tuple[str, ...] = (),
    python: str | None = None,
) -> LaunchContext:
    return LaunchContext(
        python=python or str(envs.python(point.env)),
        run_file=str(SweepDir(sweep_dir).run_file(point.id)),
        local=local,
        rendezvous=rendezvous,
        hosts=hosts,
        srun_args=profile.srun_args,
        mpirun_args=profile.mpirun_args,
        container=profile.container,
        forward_env=tuple(name for name, _ in profile.env),
    )


def launch(point: Point, ctx: LaunchContext, profile: SiteProfile) -> Launch:
    """The argv and environment that start the point's ranks; the point's `environ` wins."""
    launcher = LAUNCHERS.get(point.launcher)()
    env = launcher.environment(point, ctx)
    env.update(profile.env)
    env.update(point.environ)
    return Launch(point, launcher.command(point, ctx), env, ctx.run_file)


def launch_for(point: Point, sweep_dir: Path, profile: SiteProfile, local: bool) -> Launch:
    """The launch as planned on the submitting host (job-time values shown as stand-ins)."""
    if local:
        ctx = context(point, sweep_dir, profile, local)
    else:
        ctx = context(point, sweep_dir, profile, local, JOB_TIME_RENDEZVOUS, JOB_TIME_HOSTS)
    return launch(point, ctx, profile)
