"""From a spec file to points and their launch commands, checked against the registries."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hpcbench.errors import SpecError
from hpcbench.frameworks import FRAMEWORKS
from hpcbench.launchers import LAUNCHERS, LaunchContext
from hpcbench.runfile import RunFile
from hpcbench.spec import Point, Sweep, load_sweep


def choices() -> dict[str, list[str]]:
    """Allowed values of the registry-backed point fields."""
    frameworks = list(FRAMEWORKS)
    return {
        "framework": FRAMEWORKS.names(),
        "launcher": LAUNCHERS.names(),
        "model": sorted({m for f in frameworks for m in f.models}),
        "dataset": sorted({d for f in frameworks for d in f.datasets}),
        "env": [],  # named environments come with envs/ support
    }


def check_point(point: Point) -> Iterable[tuple[str, str, str]]:
    yield from FRAMEWORKS.get(point.framework).check_point(point)
    yield from LAUNCHERS.get(point.launcher).check_point(point)


def load(spec_path: Path) -> Sweep:
    try:
        text = spec_path.read_text()
    except OSError as exc:
        raise SpecError(str(spec_path), f"cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise SpecError(str(spec_path), "is not UTF-8 text") from None
    return load_sweep(text, choices(), check_point)


@dataclass(frozen=True)
class Launch:
    point: Point
    argv: list[str]
    env: dict[str, str]  # added to the submitting environment


def launch_for(point: Point, sweep_dir: Path, local: bool) -> Launch:
    launcher = LAUNCHERS.get(point.launcher)()
    ctx = LaunchContext(python=sys.executable, run_file=str(RunFile.path_for(sweep_dir, point.id)), local=local)
    env = launcher.environment(point, ctx)
    env.update(point.environ)
    return Launch(point, launcher.command(point, ctx), env)
