"""resources.rank_use finds each rank's window by binary search over its samples sorted once;
it must pick the samples the plain definition picks (rank_window's): the latest sample at or
before the first timed iteration's start (the first of equal times), the earliest at or after
the last one's end, among the rank's own samples where it took some. Checked against that
definition, written out here with masks, on samples out of order, with equal and unknown
times, ranks out of range and ranks without a timed iteration."""

from __future__ import annotations

import numpy as np
import pytest

from hpcbench.analysis import resources
from hpcbench.store import schema
from hpcbench.store.schema import CHILD_RUN


def _plain_window(samples: np.ndarray, row: np.ndarray) -> tuple[np.void, np.void] | None:
    timed = row[row["warmup"] == 0]
    if (samples[CHILD_RUN] >= 0).any():
        samples = samples[samples[CHILD_RUN] >= 0]
    if timed.size == 0 or samples.size == 0:
        return None
    before = samples[samples["t"] <= timed["t_start"][0] + resources.WINDOW_SLACK_S]
    after = samples[samples["t"] >= timed["t_end"][-1] - resources.WINDOW_SLACK_S]
    if before.size == 0 or after.size == 0:
        return None
    return before[np.argmax(before["t"])], after[np.argmin(after["t"])]


def _plain_share(samples: np.ndarray, a: np.void, b: np.void, *states: str) -> float:
    inside = samples[(samples["t"] > a["t"]) & (samples["t"] <= b["t"])]
    if inside.size == 0:
        return float("nan")
    spans = np.diff(np.concatenate(([float(a["t"])], inside["t"].astype(float))))
    share = sum((inside[state].astype(float) for state in states), np.zeros(inside.size)) / 100.0
    ok = np.isfinite(share) & (spans > 0)
    return float(np.average(share[ok], weights=spans[ok])) if ok.any() else float("nan")


def _plain_use(rows: np.ndarray, iterations: np.ndarray) -> np.ndarray:
    out = np.full((iterations.shape[0], 8), np.nan)
    by_rank = rows[np.lexsort((rows["t"], rows["rank"]))]
    for r in range(iterations.shape[0]):
        samples = by_rank[by_rank["rank"] == r]
        window = _plain_window(samples, iterations[r])
        if window is not None:
            out[r, :3] = resources._rank_use(*window)
            out[r, 3] = _plain_share(samples, *window, "cpu_user", "cpu_system")
            out[r, 4] = resources._child_cpus(*window)
            out[r, 5] = _plain_share(samples, *window, "cpu_steal")
            out[r, 6] = resources._work_wait(*window)
            out[r, 7] = float(min(window[0][CHILD_RUN], window[1][CHILD_RUN]) >= 0)
    return out


def _sweep_point(seed: int, n_ranks: int = 6, n_iters: int = 8, per_rank: int = 12) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    it = np.zeros((n_ranks, n_iters), dtype=schema.ITERATION_DTYPE)
    it["t_start"] = np.arange(n_iters) + rng.random((n_ranks, 1))
    it["t_end"] = it["t_start"] + 0.5
    it["warmup"][:, :2] = 1
    it["warmup"][0] = 1  # rank 0: no timed iteration
    rows = np.zeros(n_ranks * per_rank + 3, dtype=schema.RESOURCE_DTYPE)
    rows["rank"] = np.concatenate([np.repeat(np.arange(n_ranks), per_rank), [-1, n_ranks, 2]])
    rows["t"] = rng.integers(0, 2 * n_iters + 4, len(rows)) / 2.0  # on a grid: equal times
    rows["t"][rng.random(len(rows)) < 0.05] = np.nan
    for name in ("sched_run_ns", "main_run_ns", "main_wait_ns", CHILD_RUN):
        rows[name] = rng.integers(0, 10**10, len(rows))
    rows[CHILD_RUN][(rows["rank"] % 2 == 1) & (rng.random(len(rows)) < 0.5)] = -1  # some periodic samples
    rows[CHILD_RUN][rows["rank"] == 4] = -1  # a rank without samples of its own
    for name in ("cpu_user", "cpu_system", "cpu_steal", schema.WORK_WAIT):
        rows[name] = 100 * rng.random(len(rows))
    return rows[rng.permutation(len(rows))], it


@pytest.mark.parametrize("seed", range(12))
def test_the_windows_found_by_search_are_the_plain_definitions(seed: int) -> None:
    rows, it = _sweep_point(seed)
    expected = _plain_use(rows, it)
    assert np.isfinite(expected[:, 7]).sum() >= 2  # windows found: the comparison is not of NaNs only
    np.testing.assert_array_equal(resources.rank_use(rows, it), expected)
    in_order = rows[np.lexsort((rows["t"], rows["rank"]))]
    np.testing.assert_array_equal(resources.rank_use(in_order, it), expected)
    for r in range(it.shape[0]):  # rank_window, on one rank's samples in any order, picks the same
        plain = _plain_window(in_order[in_order["rank"] == r], it[r])
        found = resources.rank_window(rows[rows["rank"] == r], it[r])
        assert (found is None) == (plain is None)
        if found is not None and plain is not None:
            assert found[0].tobytes() == plain[0].tobytes() and found[1].tobytes() == plain[1].tobytes()
