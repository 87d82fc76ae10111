"""Site profiles: what a cluster needs around every job (modules, network settings, container).

A profile is a YAML file, found by name in $HPCBENCH_PROFILES (a ':'-separated list of
folders) and then among the profiles shipped in the package (`hpcbench/plan/site_profiles/`,
package data, so an installed hpcbench has them too), or given by path::

    description: one line
    modules: [gcc/12, openmpi/4.1]           # `module load ...` before the job's command
    setup: ["source /etc/profile"]           # more shell lines before it (shell, by design)
    env: {NCCL_IB_HCA: mlx5_0, UCX_NET_DEVICES: mlx5_0:1}   # for every rank
    srun_args: [--mpi=pmix]                  # how srun starts MPI ranks here
    mpirun_args: []                          # extra mpirun options inside a job
    container: [apptainer, exec, --nv, /images/dl.sif]   # prefix of every rank's command
    slurm: {partition: gpu, account: proj}   # option defaults under the spec's slurm section

A section named after an executor (`slurm:`) holds that executor's option defaults and is
validated by that executor's own parser, handed in by the caller.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hpcbench.errors import SpecError
from hpcbench.spec import OptionsParser, environ_items, parse_yaml
from hpcbench.spec.point import freeze, thaw

DEFAULT = "generic"
_SHIPPED_DIR = Path(__file__).resolve().parent / "site_profiles"
_KEYS = ("description", "modules", "setup", "env", "srun_args", "mpirun_args", "container", "slurm")


@dataclass(frozen=True)
class SiteProfile:
    name: str
    path: str
    description: str = ""
    modules: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    srun_args: tuple[str, ...] = ("--mpi=pmix",)
    mpirun_args: tuple[str, ...] = ()
    container: tuple[str, ...] = ()
    slurm: tuple[tuple[str, Any], ...] = ()

    def setup_lines(self) -> list[str]:
        lines = [shlex.join(["module", "load", *self.modules])] if self.modules else []
        return lines + list(self.setup)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "description": self.description,
            "modules": list(self.modules),
            "setup": list(self.setup),
            "env": dict(self.env),
            "srun_args": list(self.srun_args),
            "mpirun_args": list(self.mpirun_args),
            "container": list(self.container),
            "slurm": thaw(self.slurm),
        }


def search_path() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("HPCBENCH_PROFILES", "").split(":") if p]
    return [*extra, _SHIPPED_DIR]


def available() -> list[str]:
    return sorted({p.stem for d in search_path() if d.is_dir() for p in d.glob("*.yaml")})


def _strings(path: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v and "\0" not in v for v in value):
        raise SpecError(path, f"{value!r} is not a list of strings", "a list of non-empty strings")
    return tuple(value)


def parse(name: str, path: Path, text: str, sections: Mapping[str, OptionsParser] | None = None) -> SiteProfile:
    raw = parse_yaml(text) or {}
    where = f"profile {name}"
    if not isinstance(raw, Mapping):
        raise SpecError(where, "is not a mapping", ", ".join(_KEYS))
    for key in raw:
        if key not in _KEYS:
            raise SpecError(f"{where}: {key}", "unknown key", ", ".join(_KEYS))
    values: dict[str, Any] = {}
    for key in ("modules", "setup", "srun_args", "mpirun_args", "container"):
        if key in raw:
            values[key] = _strings(f"{where}: {key}", raw[key])
    if "env" in raw:
        values["env"] = environ_items(f"{where}: env", raw["env"])
    if "slurm" in raw:
        parse_options = (sections or {}).get("slurm")
        checked = parse_options(f"{where}: slurm", raw["slurm"]) if parse_options else raw["slurm"]
        values["slurm"] = freeze(f"{where}: slurm", checked)
    description = raw.get("description") or ""
    if not isinstance(description, str):
        raise SpecError(f"{where}: description", f"{description!r} is not a string", "one line of text")
    return SiteProfile(name=name, path=str(path), description=description, **values)


def load(name_or_path: str | None, sections: Mapping[str, OptionsParser] | None = None) -> SiteProfile:
    """The profile of that name (or file); `None` means the generic one. `sections` are the
    executors' option parsers (`hpcbench.plan.launch.sections`)."""
    name = name_or_path or DEFAULT
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml") or os.sep in name:
        paths = [candidate]
    else:
        paths = [d / f"{name}.yaml" for d in search_path()]
    for path in paths:
        if path.is_file():
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise SpecError("profile", f"{path} cannot be read ({exc})") from None
            return parse(candidate.stem, path, text, sections)
    raise SpecError("profile", f"{name!r} not found", ", ".join(available()) or "no profiles found")


def from_dict(d: Mapping[str, Any], sections: Mapping[str, OptionsParser] | None = None) -> SiteProfile:
    """The profile recorded in a run file (SiteProfile.as_dict, validated when the run file
    was written) back as a SiteProfile."""
    text = yaml.safe_dump({k: v for k, v in d.items() if k in _KEYS})
    return parse(str(d.get("name", DEFAULT)), Path(str(d.get("path", ""))), text, sections)


def dump(profile: SiteProfile) -> str:
    return yaml.safe_dump(profile.as_dict(), sort_keys=True)
