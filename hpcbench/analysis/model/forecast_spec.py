"""The input of `hpcbench predict FILE.yaml`: a model of one training job, no trace needed.

::

    model: resnet50                  # a zoo model (per-tensor gradients, FLOP-proportional backward)
    # layers: [[grad_bytes, backward_s], ...]   # or the layers themselves, input side first
    batch_size: 64                   # per rank
    single_rank: {throughput: 253.1} # samples/s of one rank; or
    # single_rank: {phases: {data: 0, h2d: 0, forward: 0.08, backward: 0.16, update: 0.01}}  (seconds)
    forward_backward_ratio: 0.5      # forward / backward, to split a throughput (default 0.5, 1:2)
    ranks_per_node: 4
    # devices_per_rank: 8            # one process drives 8 devices (default 1); batch_size is then per device
    # host: {per_sample_us: 16}      # its host work per device and step, serialised over the devices:
    #                                # {seconds: ..} | {fraction: ..} of one device's step | {per_sample_us: ..}
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

A transformer's parallel layouts (`hpcbench predict FILE.yaml --layouts`, model/layouts.py) take
these too (each optional otherwise)::

    seq_len: 1024                    # tokens per sample (default: the model's own)
    precision: bf16                  # fp32 | tf32 | bf16 | fp16 (default fp32)
    optimizer: adamw                 # sgd | momentum | adam | adamw (default adamw)
    device_memory_gb: 80             # GiB per device (needed by --layouts)
    peak_tflops: 989.4               # the device's dense peak for the precision, or
    # device: NVIDIA H100 SXM        # a device of the peaks table (devices/peaks.py)
    efficiency: 0.4                  # the share of the peak the compute reaches (default 0.5)
    flash_attention: false           # a fused attention kernel keeps no S^2 scores (default false)
    layouts: {microbatches: 8, schedules: [1f1b, gpipe], only: [{tp: 2, pp: 2}]}   # optional

`single_rank` (a measured one-rank time, for batch_size samples) may then be left out: the
one rank's step is the model's FLOPs over the peak × efficiency.

Every error names the key, what is wrong and what is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcbench.analysis.model import mpi_rules
from hpcbench.analysis.model.collectives import ALGORITHMS
from hpcbench.analysis.model.exchange import Exchange
from hpcbench.analysis.model.forecast_links import LINK_KEYS as LINK_KEYS
from hpcbench.analysis.model.forecast_links import Level as Level
from hpcbench.analysis.model.forecast_links import count as _count
from hpcbench.analysis.model.forecast_links import levels
from hpcbench.analysis.model.forecast_links import mapping as _mapping
from hpcbench.analysis.model.forecast_links import network_link as network_link
from hpcbench.analysis.model.forecast_links import number as _number
from hpcbench.analysis.model.iteration import HostWork, Layer, PhaseTimes
from hpcbench.analysis.model.layouts import (
    SCHEDULES,
    LayoutError,
    Transformer,
    default_microbatches,
    problems,
    transformer,
)
from hpcbench.devices import peaks
from hpcbench.errors import HpcbenchError, SpecError
from hpcbench.spec import parallel, parse_yaml
from hpcbench.spec.fields import OPTIMIZERS, PRECISIONS
from hpcbench.spec.parallel import Layout
from hpcbench.workloads import zoo
from hpcbench.workloads.costs import tensor_costs
from hpcbench.workloads.flops import model_flops

KEYS = ("model", "layers", "batch_size", "single_rank", "forward_backward_ratio", "ranks_per_node", "nodes",
        "links", "exchange", "name", "seq_len", "precision", "optimizer", "device_memory_gb", "peak_tflops",
        "device", "efficiency", "flash_attention", "layouts", "devices_per_rank", "host")  # fmt: skip
HOST_KEYS = ("seconds", "fraction", "per_sample_us")
PHASE_KEYS = ("data", "h2d", "forward", "backward", "update")
LAYOUT_KEYS = ("microbatches", "schedules", "only")
DEFAULT_EFFICIENCY = 0.5
DEFAULT_OPTIMIZER = "adamw"


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
    # what the layout model (model/layouts.py) takes beyond the above
    model: str | None = None  # the zoo model, when one is named
    seq_len: int | None = None  # tokens per sample (None: the model's own)
    precision: str = "fp32"
    optimizer: str = DEFAULT_OPTIMIZER
    device_memory_gb: float | None = None  # GiB per device
    peak_flops: float | None = None  # the device's dense peak for the precision, FLOP/s
    peak_source: str = ""  # where the peak comes from (the YAML, or the peaks table's row)
    efficiency: float = DEFAULT_EFFICIENCY
    single_rank_s: float | None = None  # a measured one-rank step of batch_size samples
    flash_attention: bool = False
    microbatches: int | None = None  # the pipeline's micro-batches (None: layouts.default_microbatches)
    schedules: tuple[str, ...] = ("1f1b",)
    only: tuple[Layout, ...] = ()  # the layouts to predict (dp filled per node count); (): all
    devices_per_rank: int = 1  # devices one process drives (batch_size is per device)
    host: HostWork = field(default_factory=HostWork)  # its host work per device and step, as given
    host_s: float = 0.0  # that work in seconds (host.per_device of one device's step)

    @property
    def devices_per_node(self) -> int:
        return self.ranks_per_node * self.devices_per_rank


def _phases(raw: Mapping[str, Any], batch: int, peak_step: float | None = None) -> tuple[PhaseTimes, float]:
    """The one rank's phases and its backward; without `single_rank`, `peak_step` (the model's
    FLOPs over the peak) split 1 : 2 between forward and backward."""
    if raw.get("single_rank") is None and peak_step is not None:
        return PhaseTimes(forward=peak_step / 3), peak_step * 2 / 3
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


def _zoo_model(raw: Mapping[str, Any]) -> zoo.Model:
    """The zoo model `model` names, at `seq_len` tokens where given."""
    name = raw["model"]
    if name not in zoo.NAMES:
        raise SpecError("model", f"{name!r} is not known", ", ".join(zoo.NAMES))
    seq_len = raw.get("seq_len")
    if seq_len is None:
        return zoo.model(str(name))
    tokens = _count("seq_len", seq_len)
    sequences = [n for n in zoo.TRANSFORMER_NAMES if len(zoo.model(n).input) == 1]
    if name not in sequences:
        raise SpecError("seq_len", f"is set but {name} does not read token sequences", "seq_len with " +
                        ", ".join(sequences))  # fmt: skip
    try:
        return zoo.model(str(name), (tokens,))
    except HpcbenchError as exc:
        raise SpecError("seq_len", str(exc), "at most the positions the model learns") from None


def _layers(raw: Mapping[str, Any], backward: float) -> tuple[tuple[Layer, ...], str]:
    if ("model" in raw) == ("layers" in raw):
        raise SpecError("model", "give exactly one of model and layers", "model: " + ", ".join(zoo.NAMES))
    if "model" in raw:
        costs = tensor_costs(_zoo_model(raw))
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


def _host(raw: Any) -> HostWork:
    """`host: {seconds: S} | {fraction: F} | {per_sample_us: U}`: one process's host work per device and step."""
    allowed = "one of seconds: S (per device and step), fraction: F (of one device's step, < 1), per_sample_us: U"
    if raw is None:
        return HostWork()
    m = _mapping("host", raw, HOST_KEYS)
    if len(m) != 1:
        raise SpecError("host", f"{dict(m)!r} does not give exactly one form", allowed)
    key, value = next(iter(m.items()))
    number = _number(f"host.{key}", value)
    if key == "fraction" and number >= 1:
        raise SpecError("host.fraction", f"{value!r} is the whole step or more", "a number >= 0 and < 1")
    if key == "seconds":
        return HostWork(seconds=number)
    if key == "fraction":
        return HostWork(fraction=number)
    return HostWork(per_sample_s=number * 1e-6)


def _one_of(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise SpecError(key, f"{value!r} is not one of them", ", ".join(allowed))
    return str(value)


def _peak(raw: Mapping[str, Any], precision: str) -> tuple[float | None, str]:
    """(FLOP/s, where from) of `peak_tflops` or of `device`'s row in the peaks table; (None, "")."""
    if "peak_tflops" in raw and "device" in raw:
        raise SpecError("peak_tflops", "is given beside device", "one of peak_tflops and device")
    if "peak_tflops" in raw:
        return _number("peak_tflops", raw["peak_tflops"], strict=True) * 1e12, "peak_tflops"
    if "device" not in raw:
        return None, ""
    rows = [r.name for r in peaks.TABLE]
    name = raw["device"]
    row = peaks.match(name) if isinstance(name, str) else None
    if row is None:
        raise SpecError("device", f"{name!r} is not a device of the peaks table", ", ".join(rows))
    dtype = peaks.dtype_for_precision(precision)
    peak = row.peak(dtype)
    if peak is None:
        with_dtype = [r.name for r in peaks.TABLE if r.peak(dtype) is not None]
        raise SpecError("device", f"{row.name} has no {dtype} peak (precision {precision})",
                        f"a device with one: {', '.join(with_dtype)}")  # fmt: skip
    return peak.flops_per_s, f"{row.name} {dtype} peak"


def _single_rank_s(raw: Mapping[str, Any], phases: PhaseTimes, backward: float) -> float | None:
    """The measured one-rank step (seconds for batch_size samples), where `single_rank` gives it."""
    if raw.get("single_rank") is None:
        return None
    return phases.data + phases.h2d + phases.forward + backward + phases.update


def _layouts(raw: Any, batch: int, model: Transformer | None) -> tuple[int | None, tuple[str, ...], tuple[Layout, ...]]:
    """`layouts`: (micro-batches, schedules, the layouts to predict only)."""
    m = _mapping("layouts", raw if raw is not None else {}, LAYOUT_KEYS)
    microbatches = _count("layouts.microbatches", m["microbatches"]) if "microbatches" in m else None
    if microbatches is not None and batch % microbatches:
        raise SpecError("layouts.microbatches", f"{microbatches} does not divide batch_size {batch}",
                        "a divisor of batch_size")  # fmt: skip
    schedules = m.get("schedules", ["1f1b"])
    if not isinstance(schedules, list) or not schedules:
        raise SpecError("layouts.schedules", f"{schedules!r} is not a non-empty list", ", ".join(SCHEDULES))
    for i, schedule in enumerate(schedules):
        _one_of(f"layouts.schedules[{i}]", schedule, SCHEDULES)
    only = m.get("only", [])
    if not isinstance(only, list):
        raise SpecError("layouts.only", f"{only!r} is not a list", "a list of layouts, e.g. [{tp: 2, pp: 2}]")
    found = []
    for i, item in enumerate(only):
        where = f"layouts.only[{i}]"
        items = dict(parallel.parse(where, item))
        if "dp" in items:
            raise SpecError(f"{where}.dp", "is filled to each node count's ranks", "fsdp, tp, pp, zero, "
                            "microbatches, schedule")  # fmt: skip
        pp = items.get("pp", 1)
        layout = Layout(1, items.get("fsdp", 1), items.get("tp", 1), pp, items.get("zero", 3),
                        items.get("microbatches", microbatches or default_microbatches(batch, pp)),
                        items.get("schedule", "1f1b"))  # fmt: skip
        if model is not None:
            wrong = problems(layout, model, batch)
            if wrong:
                raise SpecError(where, "; ".join(wrong), f"tp dividing {model.heads} heads, {model.kv_heads} KV heads "
                                f"and MLP width {model.hidden}; pp <= {model.blocks}")  # fmt: skip
        found.append(layout)
    return microbatches, tuple(str(s) for s in schedules), tuple(found)


def layout_model(spec: ForecastSpec) -> Transformer:
    """The spec's model as the layout model takes it; SpecError naming `model` otherwise."""
    if spec.model is None:
        raise SpecError("model", "--layouts needs a zoo transformer, not layers", ", ".join(zoo.TRANSFORMER_NAMES))
    try:
        return transformer(spec.model, spec.seq_len)
    except LayoutError as exc:
        raise SpecError("model", str(exc), ", ".join(zoo.TRANSFORMER_NAMES)) from None


def parse(text: str, base: Path | None = None) -> ForecastSpec:
    """The spec in `text`; relative paths in it (links.from_commbench) are taken from `base`."""
    raw = parse_yaml(text)
    raw = _mapping("spec", raw, KEYS)
    batch = _count("batch_size", raw.get("batch_size"))
    _layers(raw, 0.0)  # the model first: the most basic of the keys
    precision = _one_of("precision", raw.get("precision", "fp32"), PRECISIONS)
    optimizer = _one_of("optimizer", raw.get("optimizer", DEFAULT_OPTIMIZER), OPTIMIZERS)
    peak, peak_source = _peak(raw, precision)
    efficiency = _number("efficiency", raw.get("efficiency", DEFAULT_EFFICIENCY), strict=True)
    if efficiency > 1:
        raise SpecError("efficiency", f"{efficiency!r} is more than the whole peak", "a number > 0 and <= 1")
    memory = raw.get("device_memory_gb")
    memory_gb = None if memory is None else _number("device_memory_gb", memory, strict=True)
    flash = raw.get("flash_attention", False)
    if not isinstance(flash, bool):
        raise SpecError("flash_attention", f"{flash!r} is not a boolean", "true, false")
    peak_step = None
    if raw.get("single_rank") is None and peak is not None:
        if "model" not in raw:
            raise SpecError("peak_tflops" if "peak_tflops" in raw else "device", "gives a compute time only with "
                            "a zoo model (its FLOPs)", "single_rank with layers")  # fmt: skip
        peak_step = model_flops(_zoo_model(raw)).training * batch / (peak * efficiency)
    phases, backward = _phases(raw, batch, peak_step)
    layers, label = _layers(raw, backward)
    layout_of: Transformer | None = None
    if "model" in raw and raw["model"] in zoo.TRANSFORMER_NAMES:
        try:
            layout_of = transformer(str(raw["model"]), raw.get("seq_len"))
        except LayoutError:
            layout_of = None
    microbatches, schedules, only = _layouts(raw.get("layouts"), batch, layout_of)
    nodes = raw.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise SpecError("nodes", f"{nodes!r} is not a non-empty list", "a list of node counts, e.g. [1, 2, 4, 8]")
    counts = tuple(_count(f"nodes[{i}]", n) for i, n in enumerate(nodes))
    links = _mapping("links", raw.get("links", {}), LINK_KEYS)
    given, fitted = levels(links, base)
    intra = given.get("intra", given.get("inter"))  # one level given: the same cost on both
    inter = given.get("inter", given.get("intra"))
    assert intra is not None
    assert inter is not None
    exchange, algorithm = _exchange(raw.get("exchange"))
    host = _host(raw.get("host"))
    device_step = phases.data + phases.h2d + phases.forward + backward + phases.update
    return ForecastSpec(
        name=str(raw.get("name", label)), layers=layers, phases=phases, batch_size=batch,
        ranks_per_node=_count("ranks_per_node", raw.get("ranks_per_node", 1)), nodes=counts, intra=intra,
        inter=inter, nics_per_node=_count("links.nics_per_node", links.get("nics_per_node", 1)),
        exchange=exchange, algorithm=algorithm, link_notes=tuple(fit.describe() for fit in fitted.values()),
        model=str(raw["model"]) if "model" in raw else None, seq_len=raw.get("seq_len"), precision=precision,
        optimizer=optimizer, device_memory_gb=memory_gb, peak_flops=peak, peak_source=peak_source,
        efficiency=efficiency, single_rank_s=_single_rank_s(raw, phases, backward), flash_attention=flash,
        microbatches=microbatches, schedules=schedules, only=only,
        devices_per_rank=_count("devices_per_rank", raw.get("devices_per_rank", 1)), host=host,
        host_s=host.per_device(device_step, batch),
    )  # fmt: skip


def load(path: str) -> ForecastSpec:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise HpcbenchError(f"{path}: cannot be read ({exc.strerror})") from None
    return parse(text, Path(path).parent)
