"""Slurm job options: one dataclass is the whole vocabulary, and its fields are the valid keys.

A spec's `slurm:` section gives defaults for every point, a point's own `slurm` field
overrides them (any point field may sit in `matrix`, so `slurm` may vary per point), and a
site profile's `slurm:` section sits underneath both. Nodes, tasks and GPUs are not options:
they follow from the point and its launcher.

The Slurm executor validates its `slurm:` sections with `parse` (spec, site profile, and a
point's `slurm` field). Imports nothing of hpcbench but the error types.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hpcbench.errors import SpecError

_MEM = re.compile(r"[0-9]+[KMGT]?\Z")
_SBATCH_NAME = re.compile(r"[a-z][a-z0-9-]*\Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Options that hpcbench derives itself and must not be overridden through `additional`.
DERIVED = (
    "nodes", "ntasks", "ntasks-per-node", "gpus-per-node", "array", "output", "error", "job-name", "wrap",
    "signal", "open-mode",
)  # fmt: skip


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool | None = None
    time: int = 30  # minutes; specs may write "HH:MM:SS", "D-HH:MM" ...
    mem: str | None = None  # per node, sbatch syntax: 4000M, 16G
    cpus_per_task: int | None = None
    array_parallelism: int = 64  # array tasks running at once
    signal_delay_s: int = 60  # SIGUSR2 this long before the time limit
    additional: tuple[tuple[str, str], ...] = ()  # other sbatch options, name -> value
    setup: tuple[str, ...] = ()  # shell lines run before the job's command (module loads, ...)

    def merged(self, overrides: Mapping[str, Any]) -> SlurmOptions:
        if not overrides:
            return self
        values = dict(overrides)
        if "additional" in values:
            values["additional"] = tuple(sorted({**dict(self.additional), **dict(values["additional"])}.items()))
        return dataclasses.replace(self, **values)


FIELDS = tuple(f.name for f in dataclasses.fields(SlurmOptions))


def _text(path: str, value: Any) -> str:
    if not isinstance(value, str | int) or isinstance(value, bool) or not str(value):
        raise SpecError(path, f"{value!r} is not a non-empty string", "a string")
    text = str(value)
    if _CONTROL.search(text):
        raise SpecError(path, f"{text!r} contains control characters", "one line of printable text")
    return text


def _positive(path: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(path, f"{value!r} is not a positive integer", "integers >= 1")
    return value


def parse_time(path: str, value: Any) -> int:
    """Minutes from an int or sbatch's time syntax: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    if isinstance(value, int) and not isinstance(value, bool):
        return _positive(path, value)
    allowed = "minutes, or M:S, H:M:S, D-H, D-H:M, D-H:M:S"
    if not isinstance(value, str):
        raise SpecError(path, f"{value!r} is not a time", allowed)
    days, dash, rest = value.partition("-") if "-" in value else ("0", "", value)
    parts = rest.split(":")
    if not all(p.isascii() and p.isdigit() for p in (days, *parts)) or len(parts) > 3:
        raise SpecError(path, f"{value!r} is not a time", allowed)
    numbers = [int(p) for p in parts]
    if dash:  # D-H[:M[:S]]
        h, m, sec = [*numbers, 0, 0][:3]
    elif len(numbers) == 3:  # H:M:S
        h, m, sec = numbers
    else:  # M | M:S
        h, m, sec = 0, numbers[0], [*numbers, 0][1]
    return _positive(path, int(days) * 1440 + h * 60 + m + (1 if sec else 0))


def _boolean(path: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise SpecError(path, f"{value!r} is not a boolean", "true, false")
    return value


def _memory(path: str, value: Any) -> str:
    text = _text(path, value)
    if not _MEM.match(text):
        raise SpecError(path, f"{text!r} is not a memory size", "sbatch syntax such as 4000M or 16G")
    return text


def _additional(path: str, value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping):
        raise SpecError(path, f"{value!r} is not a mapping", "sbatch option name: value")
    out = []
    for name, v in value.items():
        if not isinstance(name, str) or not _SBATCH_NAME.match(name):
            raise SpecError(f"{path}.{name}", "is not an sbatch option name", "lower-case long option names")
        # sbatch also takes unambiguous prefixes of long options: refuse those of ours too.
        ours = (*DERIVED, *(f.replace("_", "-") for f in FIELDS))
        if any(option.startswith(name) for option in ours):
            raise SpecError(f"{path}.{name}", "is set by hpcbench or by its own key", "other sbatch options")
        out.append((name, _text(f"{path}.{name}", v)))
    return tuple(sorted(out))


def _lines(path: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise SpecError(path, f"{value!r} is not a list", "a list of shell lines")
    return tuple(_text(f"{path}[{i}]", line) for i, line in enumerate(value))


# The checker of every option: (path, value) -> canonical value, or SpecError.
CHECKERS: dict[str, Callable[[str, Any], Any]] = {
    "partition": _text,
    "account": _text,
    "qos": _text,
    "constraint": _text,
    "exclusive": _boolean,
    "time": parse_time,
    "mem": _memory,
    "cpus_per_task": _positive,
    "array_parallelism": _positive,
    "signal_delay_s": _positive,
    "additional": _additional,
    "setup": _lines,
}
assert set(CHECKERS) == set(FIELDS), "every option has a checker"


def _check(path: str, key: str, value: Any) -> Any:
    checker = CHECKERS.get(key)
    if checker is None:
        raise SpecError(f"{path}.{key}", "unknown key", ", ".join(FIELDS))
    return checker(f"{path}.{key}", value)


def parse(path: str, raw: Any) -> dict[str, Any]:
    """Validated option values of a `slurm:` mapping (only the keys it gives)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SpecError(path, f"{raw!r} is not a mapping", "a mapping of " + ", ".join(FIELDS))
    return {str(k): _check(path, str(k), v) for k, v in raw.items()}


def as_items(path: str, raw: Any) -> tuple[tuple[str, Any], ...]:
    """The point-field form of per-point overrides: sorted (key, value) pairs."""
    return tuple(sorted(parse(path, raw).items()))


def to_raw(values: Mapping[str, Any]) -> dict[str, Any]:
    """Back to the spec's (and JSON's) form: `additional` a mapping, `setup` a list."""
    out = dict(values)
    if "additional" in out:
        out["additional"] = dict(out["additional"])
    if "setup" in out:
        out["setup"] = list(out["setup"])
    return out
