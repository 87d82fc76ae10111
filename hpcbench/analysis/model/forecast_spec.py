"""The input of `hpcbench predict FILE.yaml`: a model of one training job, no trace needed.

::

    model: resnet50                  # a zoo model (per-tensor gradients, FLOP-proportional backward)
    # layers: [[grad_bytes, backward_s], ...]   # or the layers themselves, input side first
    batch_size: 64                   # per rank
    single_rank: {throughput: 253.1} # samples/s of one rank; or
    # single_rank: {phases: {data: 0, h2d: 0, forward: 0.08, backward: 0.16, update: 0.01}}  (seconds)
    forward_backward_ratio: 0.5      # forward / backward, to split a throughput (default 0.5, 1:2)
    ranks_per_node: 4
    nodes: [1, 2, 4, 8]
    links:
      intra: {bandwidth_gbps: 100, latency_us: 5}    # or {alpha_s: .., beta_s_per_byte: ..}
      inter: {bandwidth_gbps: 10, latency_us: 50}    # or per-P all-reduce fits as papers publish them:
      #      {fits: {8: [alpha_s, beta_s_per_byte], 16: [...]}}
      nics_per_node: 1
      # from_commbench: [intra.h5, inter.h5]   # or levels fitted on commbench files (paths relative to this
      #                                         # file): all ranks on one node -> intra, one rank per node -> inter
    exchange: {overlap: true, fusion_bytes: 0, algorithm: ring}
    #   fusion_bytes: 0 one message per tensor, "all" one message, N bytes: buckets / fused messages
    #   first_bucket_bytes: DDP's smaller first bucket; cycle_ms: Horovod's cycle (fusion per cycle)
    #   algorithm: ring | tree | rabenseifner | hierarchical, or an MPI library's own choice per
    #   message and rank count: open-mpi-4.1 | open-mpi | mpich (mpi_rules.py)

Every error names the key, what is wrong and what is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcbench.analysis.model import linkfit as calibration
from hpcbench.analysis.model import mpi_rules
from hpcbench.analysis.model.collectives import ALGORITHMS, LinkCost, MessageCost, link_from_rate
from hpcbench.analysis.model.exchange import Exchange
from hpcbench.analysis.model.iteration import Layer, PhaseTimes
from hpcbench.errors import HpcbenchError, SpecError
from hpcbench.spec import parse_yaml
from hpcbench.workloads import zoo
from hpcbench.workloads.costs import tensor_costs

KEYS = ("model", "layers", "batch_size", "single_rank", "forward_backward_ratio", "ranks_per_node", "nodes",
        "links", "exchange", "name")  # fmt: skip
PHASE_KEYS = ("data", "h2d", "forward", "backward", "update")


@dataclass(frozen=True)
class Level:
    """One level's cost: a per-hop link, or all-reduce fits per rank count (t = α_P + β_P·n)."""

    link: LinkCost | None = None
    fits: Mapping[int, MessageCost] = field(default_factory=dict)


@dataclass(frozen=True)
class ForecastSpec:
    name: str
    layers: tuple[Layer, ...]  # input side first; backward times add up to the phases' backward
    phases: PhaseTimes
    batch_size: int
    ranks_per_node: int
    nodes: tuple[int, ...]
    intra: Level
    inter: Level
    nics_per_node: int
    exchange: Exchange
    algorithm: str
    link_notes: tuple[str, ...] = ()  # where the links fitted on commbench files came from


def _number(path: str, value: Any, minimum: float = 0.0, strict: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < minimum or (strict and value <= minimum):
        allowed = f"a number {'>' if strict else '>='} {minimum:g}"
        raise SpecError(path, f"{value!r} is not {allowed}", allowed)
    return float(value)


def _count(path: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(path, f"{value!r} is not a positive integer", "integers >= 1")
    return value


def _mapping(path: str, value: Any, keys: tuple[str, ...]) -> Mapping[str, Any]:
    if value is None:
        raise SpecError(path, "is missing", "a mapping with keys " + ", ".join(keys))
    if not isinstance(value, Mapping):
        raise SpecError(path, f"{value!r} is not a mapping", "a mapping with keys " + ", ".join(keys))
    for key in value:
        if key not in keys:
            raise SpecError(f"{path}.{key}", "unknown key", ", ".join(keys))
    return value


def _fits(path: str, raw: Any) -> dict[int, MessageCost]:
    """`{P: [alpha_s, beta_s_per_byte], ...}`: all-reduce fits per rank count, as published."""
    allowed = "P: [alpha_s, beta_s_per_byte] with P >= 2 ranks"
    if not isinstance(raw, Mapping) or not raw:
        raise SpecError(path, f"{raw!r} is not a non-empty mapping", allowed)
    out: dict[int, MessageCost] = {}
    for p, pair in raw.items():
        where = f"{path}.{p}"
        if isinstance(p, bool) or not isinstance(p, int) or p < 2:
            raise SpecError(where, f"{p!r} is not a rank count >= 2", allowed)
        if not isinstance(pair, list) or len(pair) != 2:
            raise SpecError(where, f"{pair!r} is not [alpha_s, beta_s_per_byte]", allowed)
        out[p] = MessageCost(_number(f"{where}[0]", pair[0]), _number(f"{where}[1]", pair[1]))
    return out


def _level(path: str, raw: Any) -> Level:
    m = _mapping(path, raw, ("bandwidth_gbps", "latency_us", "alpha_s", "beta_s_per_byte", "fits"))
    if "fits" in m:
        return Level(fits=_fits(f"{path}.fits", m["fits"]))
    if "bandwidth_gbps" in m:
        bandwidth = _number(f"{path}.bandwidth_gbps", m["bandwidth_gbps"], strict=True)
        return Level(link_from_rate(bandwidth, _number(f"{path}.latency_us", m.get("latency_us", 0.0))))
    if "alpha_s" in m and "beta_s_per_byte" in m:
        alpha = _number(f"{path}.alpha_s", m["alpha_s"])
        return Level(LinkCost(alpha, _number(f"{path}.beta_s_per_byte", m["beta_s_per_byte"])))
    raise SpecError(path, "gives no cost", "bandwidth_gbps (+ latency_us), alpha_s + beta_s_per_byte, or fits")


def _phases(raw: Mapping[str, Any], batch: int) -> tuple[PhaseTimes, float]:
    single = _mapping("single_rank", raw.get("single_rank"), ("throughput", "phases"))
    if "phases" in single:
        ph = _mapping("single_rank.phases", single["phases"], PHASE_KEYS)
        values = {k: _number(f"single_rank.phases.{k}", ph.get(k, 0.0)) for k in PHASE_KEYS}
        return PhaseTimes(values["data"], values["h2d"], values["forward"], values["update"]), values["backward"]
    if "throughput" not in single:
        raise SpecError("single_rank", "gives neither throughput nor phases", "throughput: samples/s, or phases")
    step = batch / _number("single_rank.throughput", single["throughput"], strict=True)
    ratio = _number("forward_backward_ratio", raw.get("forward_backward_ratio", 0.5), strict=True)
    forward = step * ratio / (1 + ratio)
    return PhaseTimes(forward=forward), step - forward


def _layers(raw: Mapping[str, Any], backward: float) -> tuple[tuple[Layer, ...], str]:
    if ("model" in raw) == ("layers" in raw):
        raise SpecError("model", "give exactly one of model and layers", "model: " + ", ".join(zoo.NAMES))
    if "model" in raw:
        if raw["model"] not in zoo.NAMES:
            raise SpecError("model", f"{raw['model']!r} is not known", ", ".join(zoo.NAMES))
        costs = tensor_costs(zoo.model(str(raw["model"])))
        flops = sum(c.flops for c in costs) or 1.0
        return tuple(Layer(c.grad_bytes, backward * c.flops / flops) for c in costs), str(raw["model"])
    if not isinstance(raw["layers"], list) or not raw["layers"]:
        raise SpecError("layers", f"{raw['layers']!r} is not a non-empty list", "[[grad_bytes, backward_s], ...]")
    layers = []
    for i, pair in enumerate(raw["layers"]):
        if not isinstance(pair, list) or len(pair) != 2:
            raise SpecError(f"layers[{i}]", f"{pair!r} is not [grad_bytes, backward_s]", "[grad_bytes, backward_s]")
        layers.append(Layer(_number(f"layers[{i}][0]", pair[0]), _number(f"layers[{i}][1]", pair[1])))
    total = sum(layer.backward_s for layer in layers)
    if backward > 0 and total > 0:  # the single rank's backward wins; the layers give its split
        layers = [Layer(layer.grad_bytes, layer.backward_s * backward / total) for layer in layers]
    return tuple(layers), "layers"


def _exchange(raw: Any) -> tuple[Exchange, str]:
    m = _mapping(
        "exchange",
        raw if raw is not None else {},
        ("overlap", "fusion_bytes", "first_bucket_bytes", "cycle_ms", "algorithm"),
    )
    overlap = m.get("overlap", True)
    if not isinstance(overlap, bool):
        raise SpecError("exchange.overlap", f"{overlap!r} is not a boolean", "true, false")
    fusion = m.get("fusion_bytes", 0)
    fusion_bytes = math.inf if fusion == "all" else _number("exchange.fusion_bytes", fusion)
    algorithm = m.get("algorithm", "ring")
    if algorithm not in (*ALGORITHMS, *mpi_rules.RULES):
        raise SpecError("exchange.algorithm", f"{algorithm!r} is not known", ", ".join((*ALGORITHMS, *mpi_rules.RULES)))
    first = _number("exchange.first_bucket_bytes", m.get("first_bucket_bytes", 0))
    cycle = _number("exchange.cycle_ms", m.get("cycle_ms", 0)) / 1e3
    return Exchange(fusion_bytes, first, cycle, overlap), str(algorithm)


def _from_commbench(raw: Any, base: Path | None) -> dict[str, calibration.LinkFit]:
    """Levels fitted on commbench files (calibration.levels_from_commbench)."""
    allowed = "a non-empty list of commbench files (paths relative to the prediction file)"
    if not isinstance(raw, list) or not raw or not all(isinstance(p, str) for p in raw):
        raise SpecError("links.from_commbench", f"{raw!r} is not {allowed}", allowed)
    paths = [Path(p) if Path(p).is_absolute() or base is None else base / p for p in raw]
    for i, path in enumerate(paths):
        if not path.is_file():
            raise SpecError(f"links.from_commbench[{i}]", f"{str(path)!r} is not a file", allowed)
    try:
        return {str(level): fit for level, fit in calibration.levels_from_commbench(paths).items()}
    except HpcbenchError as exc:
        raise SpecError("links.from_commbench", str(exc), "files of `hpcbench commbench -o FILE`") from None


def parse(text: str, base: Path | None = None) -> ForecastSpec:
    """The spec in `text`; relative paths in it (links.from_commbench) are taken from `base`."""
    raw = parse_yaml(text)
    raw = _mapping("spec", raw, KEYS)
    batch = _count("batch_size", raw.get("batch_size"))
    _layers(raw, 0.0)  # the model first: the most basic of the keys
    phases, backward = _phases(raw, batch)
    layers, label = _layers(raw, backward)
    nodes = raw.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise SpecError("nodes", f"{nodes!r} is not a non-empty list", "a list of node counts, e.g. [1, 2, 4, 8]")
    counts = tuple(_count(f"nodes[{i}]", n) for i, n in enumerate(nodes))
    links = _mapping("links", raw.get("links", {}), ("intra", "inter", "nics_per_node", "from_commbench"))
    if "intra" not in links and "inter" not in links and "from_commbench" not in links:
        raise SpecError("links", "gives no link", "intra and/or inter, or from_commbench: [FILES]")
    fitted = _from_commbench(links["from_commbench"], base) if "from_commbench" in links else {}
    fitted = {name: fit for name, fit in fitted.items() if name not in links}  # a level stated beside them wins
    given = {name: Level(fit.link) for name, fit in fitted.items()}
    given |= {name: _level(f"links.{name}", links[name]) for name in ("intra", "inter") if name in links}
    intra = given.get("intra", given.get("inter"))  # one level given: the same cost on both
    inter = given.get("inter", given.get("intra"))
    assert intra is not None
    assert inter is not None
    exchange, algorithm = _exchange(raw.get("exchange"))
    return ForecastSpec(
        name=str(raw.get("name", label)), layers=layers, phases=phases, batch_size=batch,
        ranks_per_node=_count("ranks_per_node", raw.get("ranks_per_node", 1)), nodes=counts, intra=intra,
        inter=inter, nics_per_node=_count("links.nics_per_node", links.get("nics_per_node", 1)),
        exchange=exchange, algorithm=algorithm, link_notes=tuple(fit.describe() for fit in fitted.values()),
    )  # fmt: skip


def load(path: str) -> ForecastSpec:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise HpcbenchError(f"{path}: cannot be read ({exc.strerror})") from None
    return parse(text, Path(path).parent)
