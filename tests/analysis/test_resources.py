"""The ranks' CPU use over the timed window, from their schedstat samples (resources.sched_row):
known counters in, known CPUs and wait shares out."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hpcbench.analysis import resources
from hpcbench.store import schema, upgrade
from hpcbench.testing.arrays import iterations, sched_rows, without

# the resources columns each schema added
ADDED = {5: schema.SCHED_COLUMNS, 6: ("cpu_steal", schema.CHILD_RUN), 7: (schema.WORK_WAIT,)}


def as_of(rows: np.ndarray, version: int) -> np.ndarray:
    """`rows` as a file of schema `version` reads: without the columns added since, which the
    reader fills with their unknown values (store/upgrade.py)."""
    later = [name for v, names in ADDED.items() if v > version for name in names]
    return upgrade.table(schema.RESOURCES, without(rows, *later), version)


def test_cpus_and_wait_share_over_the_timed_window() -> None:
    it = iterations(2, 12, warmup=2, forward=0.2)  # iteration i: [i, i + 0.2]; timed: 2..11
    rows = sched_rows(2, 1.5, 11.4, wait=0.25, cpus=1.6, runnable=0.8)
    # samples outside the window are not used: one before it opens, one after it closes
    early, late = rows[0].copy(), rows[1].copy()
    early["t"], late["t"] = 0.5, 30.0
    late["main_wait_ns"] *= 10
    use = resources.sched_row(np.concatenate([rows, [early, late]]), it)
    assert use["rank_cpus"] == pytest.approx(1.6, rel=1e-6)
    assert use["cpu_wait"] == pytest.approx(0.25, rel=1e-6)
    assert use["loop_runnable"] == pytest.approx(0.8, rel=1e-6)
    assert math.isnan(use["work_wait"])  # not read: the samples hold none
    # the wait of the threads that did the work: the window's closing sample's, mean over ranks
    worked = sched_rows(2, 1.5, 11.4, wait=0.25, work_wait=0.4)
    worked[3]["work_wait"] = 0.6
    assert resources.sched_row(worked, it)["work_wait"] == pytest.approx(0.5, rel=1e-6)
    assert math.isnan(resources.sched_row(as_of(worked, 6), it)["work_wait"])  # before schema 7


def test_unknown_when_counters_go_back_or_are_absent() -> None:
    it = iterations(1, 6, warmup=1, forward=0.2)
    rows = sched_rows(1, 0.5, 5.5, wait=0.1)
    rows[1]["sched_run_ns"] = rows[0]["sched_run_ns"] - 1  # a thread ended: the process's sum fell
    use = resources.sched_row(rows, it)
    assert math.isnan(use["rank_cpus"]) and use["cpu_wait"] == pytest.approx(0.1, rel=1e-6)
    rows["main_run_ns"] = -1  # no schedstat
    assert math.isnan(resources.sched_row(rows, it)["cpu_wait"])
    # a file from before schema 5 has no such columns; no sample at the window's start: unknown too
    old = as_of(np.zeros(2, dtype=schema.RESOURCE_DTYPE), 4)
    assert all(math.isnan(v) for v in resources.sched_row(old, it).values())
    old = as_of(sched_rows(1, 0.5, 5.5, wait=0.1), 4)  # samples that bracket the window, without schedstat
    assert all(math.isnan(v) for v in resources.sched_row(old, it, ["a"], cores=2).values())
    late = sched_rows(1, 1.5, 5.5, wait=0.1)  # opens after the first timed iteration began
    assert all(math.isnan(v) for v in resources.sched_row(late, it).values())


def test_resource_row_carries_them_beside_the_cpu_percentages() -> None:
    it = iterations(2, 4, warmup=1, forward=0.2)
    row = resources.resource_row(sched_rows(2, 0.9, 3.3, wait=0.5, cpus=0.5), it)
    assert row["rank_cpus"] == pytest.approx(0.5) and row["cpu_wait"] == pytest.approx(0.5)
    assert row["cpu_user"] == pytest.approx(50.0)
    assert set(resources.RESOURCE_COLUMNS) == set(row)


def test_other_processes_cpus_are_the_hosts_busy_cpus_less_their_ranks() -> None:
    # 3 ranks, 2 on host a and 1 on host b, 2 CPUs each; each rank ran on 0.5 CPUs over its
    # window [1.5, 11.5]. Host a's samples inside it: 40 % busy for 2 s, then 70 % for 8 s
    # (1.28 CPUs, its ranks 1.0: 0.28 other); host b: 100 % (2 CPUs, its rank 0.5: 1.5 other).
    it = iterations(3, 12, warmup=2, forward=0.2)
    opening = sched_rows(3, 1.5, 11.5, wait=0.0, cpus=0.5)
    mid = opening[1::2].copy()
    mid["t"], mid["sched_run_ns"] = 3.5, opening[1::2]["sched_run_ns"] // 5
    rows = np.concatenate([opening, mid])
    for r, (first, rest) in enumerate(((40.0, 70.0), (40.0, 70.0), (100.0, 100.0))):
        mine = rows["rank"] == r
        rows["cpu_system"][mine] = 0.0
        rows["cpu_user"][mine & (rows["t"] == 3.5)] = first
        rows["cpu_user"][mine & (rows["t"] == 11.5)] = rest
        rows["cpu_user"][mine & (rows["t"] == 1.5)] = 100.0  # covers the time before the window: not used
    use = resources.sched_row(rows, it, ["a", "a", "b"], cores=2)
    assert use["rank_cpus"] == pytest.approx(0.5, rel=1e-6)
    assert use["other_cpus"] == pytest.approx((0.28 + 1.5) / 2, rel=1e-6)
    # a host busy with its ranks alone reads 0, never below (the clocks differ a little)
    rows["cpu_user"] = 20.0
    assert resources.sched_row(rows, it, ["a", "a", "b"], cores=2)["other_cpus"] == 0.0
    # without the hosts' CPU count or each rank's host: unknown
    assert math.isnan(resources.sched_row(rows, it, ["a", "a", "b"])["other_cpus"])
    assert math.isnan(resources.sched_row(rows, it, ["a"], cores=2)["other_cpus"])


def test_the_ranks_own_child_processes_are_counted_apart_from_other_processes() -> None:
    # 2 ranks on one host of 4 CPUs, 75 % busy over the window (3 CPUs): the ranks ran on
    # 0.5 CPUs each and their children (servers, compute processes) on 0.8 each: 1.6 CPUs
    # of helpers, 3 - 1.0 - 1.6 = 0.4 CPUs of other processes.
    it = iterations(2, 12, warmup=2, forward=0.2)
    rows = sched_rows(2, 1.5, 11.5, wait=0.0, cpus=0.5, node_busy=0.75, children=0.8)
    use = resources.sched_row(rows, it, ["a", "a"], cores=4)
    assert use["helper_cpus"] == pytest.approx(1.6, rel=1e-6)
    assert use["other_cpus"] == pytest.approx(0.4, rel=1e-6)
    # a descendant ended inside the window (the sum fell): that host's helpers and others are unknown
    fell = rows.copy()
    fell["child_run_ns"][1] = fell["child_run_ns"][0] - 1
    assert all(math.isnan(resources.sched_row(fell, it, ["a", "a"], cores=4)[k]) for k in ("helper_cpus", "other_cpus"))
    # a file before schema 6 does not know the descendants: they count among the other processes
    before = resources.sched_row(as_of(rows, 5), it, ["a", "a"], cores=4)
    assert math.isnan(before["helper_cpus"]) and before["other_cpus"] == pytest.approx(2.0, rel=1e-6)


def test_notes_name_other_processes_and_the_hypervisors_steal_from_their_thresholds() -> None:
    quiet = {"other_cpus": 0.24, "helper_cpus": 1.0, "cpu_steal": 4.9}
    assert resources.disturbances(quiet) == [] and resources.host_notes("p", quiet) == []
    loud = {"other_cpus": 0.25, "helper_cpus": 1.0, "cpu_steal": 5.0}
    assert resources.disturbances(loud) == ["other processes 0.25 CPUs", "hypervisor steal 5 %"]
    other, steal = resources.host_notes("p", loud)
    assert other.startswith("point p: other processes than the ranks kept 0.25 CPUs busy") and "counted apart" in other
    assert steal.startswith("point p: the hypervisor gave 5 % of the node's CPU time to other virtual machines")
    # without the descendants measured (files before schema 6) the note says they may be the job's own
    (old,) = resources.host_notes("p", {"other_cpus": 0.3, "helper_cpus": math.nan})
    assert "the job's own" in old and "counted apart" not in old


def test_steal_is_the_mean_of_the_samples_and_unknown_in_older_files() -> None:
    it = iterations(1, 4, warmup=1, forward=0.2)
    rows = sched_rows(1, 0.9, 3.3, wait=0.0)
    rows["cpu_steal"] = [2.0, 10.0]
    assert resources.resource_row(rows, it)["cpu_steal"] == pytest.approx(6.0)
    assert math.isnan(resources.resource_row(as_of(rows, 5), it)["cpu_steal"])


def test_the_window_opens_and_closes_at_the_samples_the_rank_took_itself() -> None:
    """A periodic sample (descendants not read: -1) between the loop's edge sample and the
    window's first iteration is not taken for the edge: the descendants stay known."""
    it = iterations(1, 12, warmup=2, forward=0.2)  # timed from t = 2
    rows = sched_rows(1, 1.5, 11.5, wait=0.0, children=0.4)
    periodic = rows[0].copy()
    periodic["t"], periodic["child_run_ns"], periodic["sched_wait_ns"] = 1.9, -1, -1
    both = np.concatenate([rows, [periodic]])
    edges = resources.rank_window(np.sort(both, order="t"), it)
    assert edges is not None and [float(e["t"]) for e in edges] == [1.5, 11.5]
    assert resources.sched_row(both, it, ["a"], cores=2)["helper_cpus"] == pytest.approx(0.4, rel=1e-6)
