"""Checkers of point fields and option values: each takes (path, value) and returns the
canonical value or raises SpecError naming the path, the value and what is allowed."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, get_args

from hpcbench.errors import SpecError
from hpcbench.spec import parallel
from hpcbench.spec.point import Scalar, _sorted_items, freeze

Device = Literal["cpu", "cuda"]
Optimizer = Literal["sgd", "momentum", "adam", "adamw"]
Writer = Literal["auto", "mpio", "gather"]
Precision = Literal["fp32", "tf32", "bf16", "fp16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
DEVICES: tuple[str, ...] = get_args(Device)
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
WRITERS: tuple[str, ...] = get_args(Writer)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

Checker = Callable[[str, Any], Any]


# Upper limits: values no machine runs, refused before they reach a launcher, a job or a
# rank's memory (docs/spec.md#point-fields). Generous: far beyond today's largest systems.
MAX_NODES = 100_000
MAX_RANKS_PER_NODE = 4096
MAX_BATCH_SIZE = 2**24  # per rank: 16,777,216 samples
MAX_ITERATIONS = 10**9  # timed iterations, and warm-up ones
MAX_EPOCHS = 10**6
MAX_THREADS = 4096  # per rank
MAX_SEED = 2**32 - 1  # numpy's seeds (Chainer and MXNet seed its global generator)
MAX_SEQ_LEN = 2**20  # tokens per sample: 1,048,576
MAX_DEVICES_PER_RANK = 1024  # devices one process drives


def _int(minimum: int, maximum: int | None = None) -> Callable[[str, Any], int]:
    allowed = f"integers >= {minimum}" if maximum is None else f"integers >= {minimum} and <= {maximum}"

    def check(path: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(path, f"{value!r} is not an integer", allowed)
        if value < minimum:
            raise SpecError(path, f"{value} is too small", allowed)
        if maximum is not None and value > maximum:
            raise SpecError(path, f"{value} is too large", allowed)
        return value

    return check


def _optional(check: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    def optional(path: str, value: Any) -> Any:
        return None if value is None else check(path, value)

    return optional


def _positive_float(path: str, value: Any) -> float:
    allowed = "a positive finite number, e.g. 0.01 or 1.0e-3"
    if isinstance(value, bool):
        raise SpecError(path, f"{value!r} is not a number", allowed)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SpecError(path, f"{value!r} is not a number", allowed) from None
    if not math.isfinite(number) or number <= 0:
        raise SpecError(path, f"{value!r} is out of range", allowed)
    return number


def _text(path: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise SpecError(path, f"{value!r} is not a non-empty string", "a non-empty string")
    if "\0" in value:
        raise SpecError(path, "contains a NUL character", "a string without NUL")
    return value


def _one_of(choices: Sequence[str]) -> Callable[[str, Any], str]:
    def check(path: str, value: Any) -> str:
        if not isinstance(value, str) or value not in choices:
            raise SpecError(path, f"{value!r} is not known", ", ".join(choices) or "none defined yet")
        return value

    return check


def environ_items(path: str, value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping):
        raise SpecError(path, f"{value!r} is not a mapping", "a mapping NAME: value")
    items = []
    for name, v in value.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise SpecError(f"{path}.{name}", "is not a valid environment variable name", "[A-Za-z_][A-Za-z0-9_]*")
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise SpecError(f"{path}.{name}", f"{v!r} is not a string or number", "a string or a number")
        text = str(v)
        if "\0" in text:
            raise SpecError(f"{path}.{name}", "contains a NUL character", "a string without NUL")
        items.append((name, text))
    return tuple(sorted(items))


def _extra(path: str, value: Any) -> tuple[tuple[str, Scalar], ...]:
    if not isinstance(value, Mapping):
        raise SpecError(path, f"{value!r} is not a mapping", "a mapping key: scalar")
    for key, v in value.items():
        if not isinstance(key, str) or not key:
            raise SpecError(f"{path}.{key}", "key is not a non-empty string", "string keys")
        if not isinstance(v, (str, int, float, bool)):
            raise SpecError(f"{path}.{key}", f"{v!r} is not a scalar", "strings, numbers, booleans")
        if isinstance(v, float) and not math.isfinite(v):
            raise SpecError(f"{path}.{key}", f"{v!r} is not finite", "finite numbers")
        if isinstance(v, str) and "\0" in v:
            raise SpecError(f"{path}.{key}", "contains a NUL character", "a string without NUL")
    return _sorted_items(value)


Choices = Mapping[str, Sequence[str]]
"""Allowed values for registry-backed fields (framework, launcher, model, dataset, env,
executor): the registries above the ground floor supply them."""

OptionsParser = Callable[[str, Any], dict[str, Any]]
"""An executor's parser of its options section: (path, raw) -> validated values; raises
SpecError naming the path."""


def _section_items(parse: OptionsParser | None) -> Checker:
    """The checker of a point field that holds one executor's per-point options (`slurm`):
    the executor's own parser, then the frozen point form."""

    def check(path: str, value: Any) -> tuple[tuple[str, Any], ...]:
        return freeze(path, parse(path, value) if parse is not None else value)

    return check


def checkers(choices: Choices, sections: Mapping[str, OptionsParser]) -> dict[str, Checker]:
    """The checker of every point field; `sections` holds each executor's options parser."""

    def choice(name: str) -> Checker:
        return _one_of(tuple(choices[name])) if name in choices else _text

    return {
        "framework": choice("framework"),
        "backend": _text,  # checked per framework, once points exist
        "launcher": choice("launcher"),
        "nodes": _int(1, MAX_NODES),
        "ranks_per_node": _int(1, MAX_RANKS_PER_NODE),
        "device": _one_of(DEVICES),
        "model": choice("model"),
        "dataset": choice("dataset"),
        "data_dir": _optional(_text),
        "batch_size": _int(1, MAX_BATCH_SIZE),
        "iterations": _int(1, MAX_ITERATIONS),
        "warmup": _int(0, MAX_ITERATIONS),
        "optimizer": _one_of(OPTIMIZERS),
        "lr": _positive_float,
        "seed": _int(0, MAX_SEED),
        "threads": _optional(_int(1, MAX_THREADS)),
        "env": _optional(choice("env")),
        "environ": environ_items,
        "extra": _extra,
        "slurm": _section_items(sections.get("slurm")),
        "epochs": _optional(_int(1, MAX_EPOCHS)),
        "seq_len": _optional(_int(1, MAX_SEQ_LEN)),
        "precision": _optional(_one_of(PRECISIONS)),
        "compile": _optional(_text),  # checked per framework, once points exist
        "parallel": parallel.parse,  # its product against the ranks: parallel.check, once points exist
        "devices_per_rank": _int(1, MAX_DEVICES_PER_RANK),  # the framework's support: checked once points exist
        "memory_limit_gb": _optional(_positive_float),
    }
