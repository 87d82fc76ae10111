"""Waiting for the last rank: the synchronisation wait, and how it grows with the ranks.

An exchange cannot end before the last rank has handed over its last gradient. Where the
ranks' compute times of one iteration vary independently (the scheduler, time-shared
cores, a hypervisor's steal, caches), each rank waits on average E[max of N] − E[one] for
the last of N, which for normal variations of spread σ is σ·e(N), with

    e(N) = ∫ x · N φ(x) Φ(x)^(N−1) dx

the expected largest of N standard normal draws: e(1) = 0, e(2) = 1/√π = 0.5642,
e(4) = 1.0294, e(8) = 1.4236, e(64) = 2.3437; it grows like √(2 ln N).

The model measures the wait where it shows, at the calibration's smallest points of two or
more ranks: their exchange phase beyond what the fitted link explains there (measured −
modelled exposed exchange, at least 0: `calibrated.Calibration.sync`), and carries it to N
ranks as sync · e(N) / e(n) (`growth`). One rank waits for no one.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

_GRID = np.linspace(-12.0, 12.0, 48001)  # standard normal quantities below 1e-30 left out
_STEP = float(_GRID[1] - _GRID[0])
_PDF = np.exp(-0.5 * _GRID**2) / math.sqrt(2 * math.pi)
_CDF = 0.5 * (1.0 + np.array([math.erf(x / math.sqrt(2.0)) for x in _GRID]))


@lru_cache(maxsize=256)
def expected_max(n: int) -> float:
    """e(n): the expected largest of n independent standard normal draws (0 for n = 1)."""
    if n < 1:
        raise ValueError(f"expected_max needs n >= 1, got {n}")
    if n == 1:
        return 0.0
    y = _GRID * n * _PDF * _CDF ** (n - 1)
    return float((y.sum() - (y[0] + y[-1]) / 2) * _STEP)  # the trapezoidal rule


def growth(measured_ranks: int, ranks: int) -> float:
    """The factor from the wait measured at `measured_ranks` (>= 2) to the one at `ranks`."""
    if ranks < 2:
        return 0.0
    return expected_max(ranks) / expected_max(measured_ranks)
