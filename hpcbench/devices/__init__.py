"""Devices' peak FLOP/s, for MFU: the dense datasheet table (`peaks`, pure Python, which the
analysis imports) and a timed matrix product that measures a device's peak (`measure`, which
imports torch or numpy when run). This package imports `peaks` only."""

from __future__ import annotations

from hpcbench.devices.peaks import (
    DTYPES,
    TABLE,
    DevicePeaks,
    Peak,
    dtype_for_precision,
    match,
    mfu,
    mfu_problem,
    peak_for,
)

__all__ = ["DTYPES", "TABLE", "DevicePeaks", "Peak", "dtype_for_precision", "match", "mfu", "mfu_problem", "peak_for"]
