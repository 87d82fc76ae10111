"""Published scaling tables, each with its source and stated set-up, and the model's error on them.

Each `*.yaml` beside this module is one table: `source`, `setup`, `metric`, `model_inputs`
(what the prediction takes beyond the source: documented constants, and any constant the
table sets for every column, with the cells it was set on), `gpus_per_node`,
`defaults` (keys of a prediction file shared by the columns) and `columns`, each with its
`published` cells (GPUs: value, exactly as published) and the `predict` keys of its own.

Every cell is predicted through the same path as `hpcbench predict FILE.yaml`
(forecast_spec.parse, then forecast.forecast) from the column's first cell (one GPU's
throughput, as the table gives it) and those constants; nothing is tuned per cell.
A cell of g GPUs runs on ⌈g / gpus_per_node⌉ nodes of g / nodes GPUs, one process per GPU; where
the `predict` keys set `devices_per_rank: D` (one process drives up to D GPUs, as TensorFlow's
single-process modes do), a node's G GPUs of the cell are driven by G / min(D, G) processes
of min(D, G) GPUs each. Its error is predicted / published − 1; the first cell is the input,
so it is not counted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hpcbench.analysis.model import forecast, forecast_spec
from hpcbench.errors import HpcbenchError, SpecError
from hpcbench.spec import parse_yaml

HERE = Path(__file__).parent
TABLE_KEYS = ("name", "source", "setup", "metric", "model_inputs", "gpus_per_node", "defaults", "columns")


@dataclass(frozen=True)
class Cell:
    column: str
    gpus: int
    nodes: int
    ranks_per_node: int  # processes per node
    published: float
    predicted: float
    devices_per_rank: int = 1  # GPUs each process drives

    @property
    def gpus_per_node(self) -> int:
        return self.ranks_per_node * self.devices_per_rank

    @property
    def error(self) -> float:
        return self.predicted / self.published - 1.0


@dataclass(frozen=True)
class Table:
    name: str
    source: str
    setup: str
    metric: str
    cells: tuple[Cell, ...]  # the predicted cells (every column's first cell is its input)

    @property
    def mean_abs_error(self) -> float:
        return sum(abs(c.error) for c in self.cells) / len(self.cells)

    @property
    def max_abs_error(self) -> float:
        return max(abs(c.error) for c in self.cells)


def names() -> list[str]:
    """The tables shipped with hpcbench."""
    return sorted(p.stem for p in HERE.glob("*.yaml"))


def path_of(name: str) -> Path:
    path = HERE / f"{name}.yaml"
    if not path.is_file():
        raise HpcbenchError(f"no published table {name!r} (known: {', '.join(names())})")
    return path


def is_table(raw: Any) -> bool:
    """A mapping with `columns` and `source`: a published table, not a prediction file."""
    return isinstance(raw, Mapping) and "columns" in raw and "source" in raw


def _merge(base: Mapping[str, Any], more: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in more.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) else value
        )
    return out


def _text(raw: Mapping[str, Any], key: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value.strip():
        raise SpecError(key, f"{value!r} is not a non-empty text", "where the table comes from / what it states")
    return value.strip()


def _cells(column: str, raw: Any) -> list[tuple[int, float]]:
    where = f"columns.{column}.published"
    allowed = "GPUs: value, e.g. {1: 142, 2: 284}"
    if not isinstance(raw, Mapping) or len(raw) < 2:
        raise SpecError(where, f"{raw!r} is not a mapping of two or more cells", allowed)
    cells = []
    for gpus, value in raw.items():
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1 or not ok:
            raise SpecError(f"{where}.{gpus}", f"{gpus!r}: {value!r} is not a GPU count and a positive value", allowed)
        cells.append((gpus, float(value)))
    return sorted(cells)


def _placement(gpus: int, per_node: int) -> tuple[int, int]:
    nodes = max(1, math.ceil(gpus / per_node))
    if gpus % nodes:
        raise SpecError("gpus_per_node", f"{gpus} GPUs do not fill {nodes} nodes evenly", "a divisor layout")
    return nodes, gpus // nodes


def _devices_per_rank(spec: Mapping[str, Any], per: int) -> int:
    """GPUs per process on a node of `per` GPUs: min(D, per) for the spec's `devices_per_rank` D."""
    d = spec.get("devices_per_rank", 1)
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise SpecError("devices_per_rank", f"{d!r} is not a positive integer", "integers >= 1")
    d = min(d, per)
    if per % d:
        raise SpecError("devices_per_rank", f"{per} GPUs of a node do not make processes of {d}", "a divisor layout")
    return d


def predict_cell(spec: Mapping[str, Any], first: tuple[int, float], gpus: int, per_node: int) -> tuple[int, int, float]:
    """(nodes, ranks per node, predicted total throughput) of one cell, through `hpcbench predict`'s path."""
    nodes, per = _placement(gpus, per_node)
    devices = _devices_per_rank(spec, per)
    one_gpu = first[1] / first[0]  # the first cell's throughput per GPU is one GPU's, driven alone
    raw = {**spec, "single_rank": {"throughput": one_gpu}, "nodes": [nodes], "ranks_per_node": per // devices,
           "devices_per_rank": devices}  # fmt: skip
    table = forecast.forecast(forecast_spec.parse(yaml.safe_dump(raw)))
    return nodes, per // devices, float(table["throughput"].iloc[0])


def evaluate(raw: Mapping[str, Any]) -> Table:
    """Every cell of a published table (parsed YAML) predicted, beside its published value."""
    for key in raw:
        if key not in TABLE_KEYS:
            raise SpecError(key, "unknown key", ", ".join(TABLE_KEYS))
    per_node = raw.get("gpus_per_node", 1)
    if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
        raise SpecError("gpus_per_node", f"{per_node!r} is not a positive integer", "integers >= 1")
    defaults = raw.get("defaults", {}) or {}
    columns = raw.get("columns")
    if not isinstance(columns, Mapping) or not columns or not isinstance(defaults, Mapping):
        raise SpecError("columns", f"{columns!r} is not a non-empty mapping", "name: {published: ..., predict: ...}")
    cells = []
    for column, body in columns.items():
        if not isinstance(body, Mapping) or "published" not in body:
            raise SpecError(f"columns.{column}", "has no published cells", "published: {GPUs: value}, predict: {...}")
        spec = _merge(defaults, body.get("predict", {}) or {})
        published = _cells(str(column), body["published"])
        for gpus, value in published[1:]:
            try:
                nodes, per, predicted = predict_cell(spec, published[0], gpus, per_node)
            except SpecError as exc:
                raise SpecError(f"columns.{column}.predict.{exc.path}", exc.problem, exc.allowed) from None
            devices = _devices_per_rank(spec, _placement(gpus, per_node)[1])
            cells.append(Cell(str(column), gpus, nodes, per, value, predicted, devices))
    name = str(raw.get("name", "published table"))
    return Table(name, _text(raw, "source"), _text(raw, "setup"), _text(raw, "metric"), tuple(cells))


def load(path: Path | str) -> Table:
    """A published table file, evaluated."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise HpcbenchError(f"{path}: cannot be read ({exc.strerror})") from None
    return evaluate(parse_yaml(text))


def shipped(name: str) -> Table:
    """One of the tables shipped with hpcbench, by name."""
    return load(path_of(name))
