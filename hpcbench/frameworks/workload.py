"""What the analysis needs to know of a point's workload and device, recorded once by the
worker in the provenance before the timed loop (nothing of it runs during a step):

- `model_flops_per_sample`, `attention_flops_per_sample` (workloads/flops.py: one training
  step's forward and backward products per sample, and attention's S² share of them),
  `tokens_per_sample` (0 for a model that reads images), `parameters`, `precision`;
- `device_name` (NVML's name of the GPU, or the CPU's model name and the CPUs the rank may
  use) and the peak the point's MFU is computed against: `peak_flops_per_s` per device, its
  `peak_dtype` and `peak_source` (the dense datasheet table, else a peak measured with
  `hpcbench check --peak` on a device of that name; none: MFU is not computed and the
  analysis says why), and `mfu_devices`: how many such devices the point's ranks share
  (a GPU per rank; one CPU per node).
"""

from __future__ import annotations

from typing import Any

from hpcbench.devices import cache, measure, peaks
from hpcbench.errors import HpcbenchError
from hpcbench.frameworks.base import model_for
from hpcbench.spec import Point
from hpcbench.workloads import zoo
from hpcbench.workloads.flops import model_flops


def recorded(point: Point, local_rank: int = 0) -> dict[str, Any]:
    """The provenance keys above for `point` (none for a point whose model is not the zoo's)."""
    if point.model not in zoo.NAMES:
        return {}
    model = model_for(point)
    flops = model_flops(model)
    out: dict[str, Any] = {
        "model_flops_per_sample": flops.training,
        "attention_flops_per_sample": flops.attention,
        "tokens_per_sample": model.tokens,
        "parameters": zoo.count_parameters(model),
        "precision": point.precision or "fp32",
    }
    dtype = peaks.dtype_for_precision(point.precision)
    out["peak_dtype"] = dtype
    out["mfu_devices"] = point.ranks * point.devices_per_rank if point.device == "cuda" else point.nodes
    try:
        out["device_name"] = name = measure.device_name(point.device)
        peak = peaks.peak_for(name, dtype, cache.load_measured())
    except HpcbenchError as exc:  # no name for the device, a damaged cache of measured peaks
        out["peak_source"] = f"none: {exc}"
        return out
    if peak is None:
        out["peak_source"] = f"none: {name} is not in the table and no {dtype} peak was measured on it"
    else:
        out["peak_flops_per_s"] = peak.flops_per_s
        out["peak_source"] = peak.source
    return out
