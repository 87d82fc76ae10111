"""Dense peak FLOP/s of accelerators by dtype, matched by the name NVML (or ROCm) reports, and
MFU (model FLOPs utilisation) against them (docs/metrics-and-model.md#peaks-and-mfu).

Pure Python: the analysis imports this module, and it imports no framework.

Every number is the vendor's **dense** figure: where a datasheet gives only the 2:4-sparsity
figure (marked with an asterisk), it is halved. A model's matrix products are dense, so a
sparse peak would halve every MFU. A dtype a device has no fast path for (bf16 and tf32 on a
V100 or a T4) is absent: its lookup gives None, never another dtype's number.

The names are matched by explicit patterns, most specific first, at word boundaries, so that
"H100 NVL" is no "H100 SXM", "GH200" no "H200", "A100" no "A10" and "L40S" no "L40". A name
none of them matches gives None: a peak is never guessed. A MIG slice ("... MIG 1g.5gb") has
a fraction of its GPU's units: it matches nothing either.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hpcbench.errors import HpcbenchError

DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16")  # a point's `precision` (spec/fields.py)
T = 1e12  # one TFLOP/s


@dataclass(frozen=True)
class Peak:
    """A peak rate in FLOP/s of one device for one dtype, and where the number comes from:
    "table: NVIDIA H100 SXM (... dense)" or "measured: <device> <dtype> matmul n=..., <date>"."""

    flops_per_s: float
    dtype: str
    source: str
    device: str


@dataclass(frozen=True)
class DevicePeaks:
    """One row of the table: the device's canonical name, the patterns (regular expressions,
    case-insensitive) its reported names match, its dense peak per dtype and its source."""

    name: str
    patterns: tuple[str, ...]
    flops: Mapping[str, float] = field(repr=False)
    source: str

    def matches(self, device_name: str) -> bool:
        return any(re.search(p, device_name, re.IGNORECASE) for p in self.patterns)

    def peak(self, dtype: str, device: str | None = None) -> Peak | None:
        """The peak for `dtype` (None where the device has none), credited to `device`
        (default: the table's name)."""
        value = self.flops.get(dtype)
        if value is None:
            return None
        return Peak(value, dtype, f"table: {self.name} ({self.source})", device or self.name)


def _nv(name: str, patterns: tuple[str, ...], source: str, **tflops: float) -> DevicePeaks:
    # "989.4" TFLOP/s is 989.4e12 exactly as written (989.4 * 1e12 is not, in binary)
    return DevicePeaks(name, patterns, {d: float(f"{v!r}e12") for d, v in tflops.items()}, source)


_SPARSE_HALVED = "sparse figures halved"
_HOPPER_WP = "NVIDIA H100 Tensor Core GPU Architecture whitepaper, SXM5, dense"
_HOPPER_NVL = f"NVIDIA H100/H200 NVL datasheet, per GPU, {_SPARSE_HALVED}, dense"

# Most specific first; the tests check that each known name matches exactly one row anyway.
# fmt: off
TABLE: tuple[DevicePeaks, ...] = (
    # Blackwell (two dies, one CUDA device)
    _nv(
        "NVIDIA GB200",
        (r"\bGB200\b",),
        f"NVIDIA GB200 NVL72 spec, per Blackwell GPU at 1200 W, {_SPARSE_HALVED}, dense",
        fp32=80, tf32=1250, bf16=2500, fp16=2500, fp8=5000,
    ),
    _nv(
        "NVIDIA B200",
        (r"\bB200\b",),
        f"NVIDIA HGX B200 spec, per GPU at 1000 W, {_SPARSE_HALVED}, dense",
        fp32=75, tf32=1100, bf16=2250, fp16=2250, fp8=4500,
    ),
    _nv(
        "NVIDIA B100",
        (r"\bB100\b",),
        f"NVIDIA HGX B100 launch spec (8 GPUs) per GPU, {_SPARSE_HALVED}, dense",
        fp32=60, tf32=875, bf16=1750, fp16=1750, fp8=3500,
    ),
    # Hopper
    _nv(
        "NVIDIA GH200",
        (r"\bGH200\b",),
        "NVIDIA GH200 datasheet (the H100 SXM5's compute): H100 whitepaper SXM5, dense",
        fp32=66.9, tf32=494.7, bf16=989.4, fp16=989.4, fp8=1978.9,
    ),
    _nv(
        "NVIDIA H200 NVL",
        (r"\bH200\b.*\bNVL\b",),
        _HOPPER_NVL,
        fp32=60, tf32=417.5, bf16=835.5, fp16=835.5, fp8=1670.5,
    ),
    _nv(
        "NVIDIA H200 SXM",
        (r"\bH200\b(?!.*\b(NVL|PCIE)\b)",),
        "NVIDIA H200 datasheet (the H100 SXM5's compute): H100 whitepaper SXM5, dense",
        fp32=66.9, tf32=494.7, bf16=989.4, fp16=989.4, fp8=1978.9,
    ),
    _nv(
        "NVIDIA H100 NVL",
        (r"\bH100\b.*\bNVL\b",),
        _HOPPER_NVL,
        fp32=60, tf32=417.5, bf16=835.5, fp16=835.5, fp8=1670.5,
    ),
    _nv(
        "NVIDIA H100 PCIe",
        (r"\bH100\b.*\bPCIE\b",),
        "NVIDIA H100 Tensor Core GPU Architecture whitepaper, PCIe, dense",
        fp32=51.2, tf32=378, bf16=756, fp16=756, fp8=1513,
    ),
    _nv(
        "NVIDIA H100 SXM",
        (r"\bH100\b(?!.*\b(NVL|PCIE)\b).*\b(SXM\d*|HBM3)\b",),  # NVML: "NVIDIA H100 80GB HBM3"
        _HOPPER_WP,
        fp32=66.9, tf32=494.7, bf16=989.4, fp16=989.4, fp8=1978.9,
    ),
    # Ada
    _nv(
        "NVIDIA L40S",
        (r"\bL40S\b",),
        "NVIDIA L40S datasheet, dense",
        fp32=91.6, tf32=183, bf16=362.05, fp16=362.05, fp8=733,
    ),
    _nv(
        "NVIDIA L40",
        (r"\bL40\b",),
        "NVIDIA L40 datasheet, dense",
        fp32=90.5, tf32=90.5, bf16=181.05, fp16=181.05, fp8=362,
    ),
    _nv(
        "NVIDIA L4",
        (r"\bL4\b",),
        f"NVIDIA L4 datasheet, {_SPARSE_HALVED}, dense",
        fp32=30.3, tf32=60, bf16=121, fp16=121, fp8=242.5,
    ),
    # Ampere
    _nv(
        "NVIDIA A100 SXM",
        (r"\bA100\b(?!.*\bPCIE\b).*\bSXM",),  # "NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB"
        "NVIDIA A100 datasheet (40 and 80 GB), dense",
        fp32=19.5, tf32=156, bf16=312, fp16=312,
    ),
    _nv(
        "NVIDIA A100 PCIe",
        (r"\bA100\b.*\bPCIE\b",),  # "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe"
        "NVIDIA A100 datasheet (40 and 80 GB), dense",
        fp32=19.5, tf32=156, bf16=312, fp16=312,
    ),
    _nv(
        "NVIDIA A40",
        (r"\bA40\b",),
        "NVIDIA A40 datasheet, dense",
        fp32=37.4, tf32=74.8, bf16=149.7, fp16=149.7,
    ),
    _nv(
        "NVIDIA A30",
        (r"\bA30\b",),
        "NVIDIA A30 datasheet, dense",
        fp32=10.3, tf32=82, bf16=165, fp16=165,
    ),
    _nv(
        "NVIDIA A10",
        (r"\bA10\b",),  # not the A10G, whose tensor cores are slower
        "NVIDIA A10 datasheet, dense",
        fp32=31.2, tf32=62.5, bf16=125, fp16=125,
    ),
    # Volta and Turing: fp16 on tensor cores; no bf16, no tf32
    _nv(
        "NVIDIA V100S PCIe",
        (r"\bV100S[- ]PCIE\b",),
        "NVIDIA V100S datasheet (tensor performance as fp16), dense",
        fp32=16.4, fp16=130,
    ),
    _nv(
        "NVIDIA V100 SXM2",
        (r"\bV100[- ]SXM2\b",),  # "Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB"
        "NVIDIA V100 datasheet, SXM2 (tensor performance as fp16), dense",
        fp32=15.7, fp16=125,
    ),
    _nv(
        "NVIDIA V100 PCIe",
        (r"\bV100[- ]PCIE\b",),  # "Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB"
        "NVIDIA V100 datasheet, PCIe (tensor performance as fp16), dense",
        fp32=14, fp16=112,
    ),
    _nv(
        "NVIDIA T4",
        (r"\bT4\b",),  # "Tesla T4"
        "NVIDIA T4 datasheet (mixed fp16/fp32 tensor), dense",
        fp32=8.1, fp16=65,
    ),
    # AMD Instinct (the name ROCm reports)
    _nv(
        "AMD Instinct MI325X",
        (r"\bMI325X\b",),
        "AMD Instinct MI325X datasheet, fp32 matrix, dense",
        fp32=163.4, tf32=653.7, bf16=1307.4, fp16=1307.4, fp8=2614.9,
    ),
    _nv(
        "AMD Instinct MI300X",
        (r"\bMI300X\b",),
        "AMD Instinct MI300X datasheet, fp32 matrix, dense",
        fp32=163.4, tf32=653.7, bf16=1307.4, fp16=1307.4, fp8=2614.9,
    ),
    _nv(
        "AMD Instinct MI250X",
        (r"\bMI250X\b(?!/)",),  # not "MI250X/MI250", which some ROCm versions report for both
        "AMD Instinct MI250X datasheet halved: each of its 2 GCDs is one device; fp32 matrix, dense",
        fp32=47.85, bf16=191.5, fp16=191.5,
    ),
)
# fmt: on

_MIG = re.compile(r"\bMIG\b", re.IGNORECASE)


def match(device_name: str) -> DevicePeaks | None:
    """The table's row for a device name as NVML (`nvmlDeviceGetName`) or ROCm reports it, e.g.
    "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-16GB", "AMD Instinct MI300X", or a row's own
    name; None for a name no row is known to fit (and for a MIG slice)."""
    name = " ".join(device_name.split())
    if not name or _MIG.search(name):
        return None
    return next((row for row in TABLE if row.matches(name)), None)


def dtype_for_precision(precision: str | None) -> str:
    """The dtype whose peak applies to a point's `precision`: fp32 -> fp32, tf32 -> tf32,
    bf16 -> bf16, fp16 -> fp16; None (no mixed precision, autocast off) -> fp32."""
    if precision is None:
        return "fp32"
    if precision not in PRECISIONS:
        raise HpcbenchError(f"precision {precision!r} has no peak (allowed: {', '.join(PRECISIONS)})")
    return precision


def _measured_rate(entry: object) -> float | None:
    """A cached measurement's flops_per_s where it is a positive finite number, else None."""
    if not isinstance(entry, Mapping):
        return None
    value = entry.get("flops_per_s")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def peak_for(device_name: str, dtype: str, measured: Mapping[str, Any] | None = None) -> Peak | None:
    """The peak that applies to `device_name` for `dtype`: the table's, else one measured on
    a device of exactly that name (`measured` is the cache, device -> dtype -> {flops_per_s,
    source, measured_at}: hpcbench.devices.cache.load_measured(); entries that are not of that
    shape are passed over), else None."""
    row = match(device_name)
    if row is not None:
        peak = row.peak(dtype, device_name)
        if peak is not None:
            return peak
    by_dtype = (measured or {}).get(device_name)
    entry = by_dtype.get(dtype) if isinstance(by_dtype, Mapping) else None
    rate = _measured_rate(entry)
    if rate is None or not isinstance(entry, Mapping):
        return None
    source = entry.get("source")
    return Peak(rate, dtype, source if isinstance(source, str) else f"measured: {device_name} {dtype}", device_name)


def mfu(achieved_flops_per_s: float, peak: Peak | None, devices: int) -> float:
    """Model FLOPs utilisation: the achieved rate (all `devices` together) over the peak of
    `devices` devices; NaN without a peak. A value over 1.0 is returned as it is: it is a
    wrong peak or over-counted FLOPs, and `mfu_problem` says so."""
    if devices < 1:
        raise ValueError(f"devices must be at least 1, not {devices}")
    if peak is None:
        return math.nan
    return achieved_flops_per_s / (peak.flops_per_s * devices)


def mfu_problem(value: float, peak: Peak | None) -> str | None:
    """What is wrong with an MFU over 100 % (no device exceeds its peak), or None."""
    if peak is None or not value > 1.0:
        return None
    return (
        f"MFU {value:.2f} is over 100 %: the peak ({peak.source}) is wrong for this device "
        "or the FLOPs are over-counted"
    )


def rows() -> list[tuple[str, str, str, str]]:
    """The table as (device, dtype, TFLOP/s, source) rows, dtypes in DTYPES order."""
    return [
        (row.name, dtype, f"{row.flops[dtype] / T:g}", row.source)
        for row in TABLE
        for dtype in DTYPES
        if dtype in row.flops
    ]


def markdown_table() -> str:
    """The table as Markdown, one row per device with a column per dtype (docs/metrics-and-model.md)."""
    lines = [
        "| device | " + " | ".join(DTYPES) + " | source |",
        "| --- | " + " | ".join("---:" for _ in DTYPES) + " | --- |",
    ]
    for row in TABLE:
        cells = [f"{row.flops[d] / T:g}" if d in row.flops else "—" for d in DTYPES]
        lines.append(f"| {row.name} | " + " | ".join(cells) + f" | {row.source} |")
    return "\n".join(lines)
