"""hpcbench.trace.recorder: phase marks in, ITERATION_DTYPE rows out, with exact ns inputs."""

from __future__ import annotations

import math
from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest

from hpcbench.store.schema import ITERATION_DTYPE, PHASES
from hpcbench.trace import recorder as recorder_module
from hpcbench.trace.recorder import NullRecorder, Phase, Recorder

S = 1_000_000_000  # ns per second
MS = 1_000_000


class FakeClock:
    """perf_counter_ns that returns queued values (ns)."""

    def __init__(self) -> None:
        self.queue: list[int] = []

    def push(self, *values: int) -> None:
        self.queue.extend(values)

    def perf_counter_ns(self) -> int:
        assert self.queue, "the recorder read the clock more often than the test expected"
        return self.queue.pop(0)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    fake = FakeClock()
    monkeypatch.setattr(recorder_module, "time", SimpleNamespace(perf_counter_ns=fake.perf_counter_ns))
    yield fake
    assert fake.queue == [], "clock values left unread"


# offset = clock_offset - epoch = 1 s: a perf_counter of 5 s is 6 s after the epoch
CLOCK_OFFSET = 1_700_000_001 * S
EPOCH = 1_700_000_000 * S


def full_iteration(rec: Recorder, clock: FakeClock, start: int) -> None:
    """start, every phase marked at start + 10/12/30/70/80/90 ms, stop at start + 100 ms."""
    clock.push(start)
    rec.start()
    for phase, at in ((Phase.DATA, 10), (Phase.H2D, 12), (Phase.FORWARD, 30), (Phase.BACKWARD, 70)):
        rec.mark_at(phase, start + at * MS)
    rec.mark_at(Phase.COMM, start + 80 * MS)
    rec.mark_at(Phase.UPDATE, start + 90 * MS)
    clock.push(start + 100 * MS)
    rec.stop(samples=32, loss=0.5)


def test_every_phase_marked(clock: FakeClock) -> None:
    rec = Recorder(4, CLOCK_OFFSET, EPOCH)
    full_iteration(rec, clock, 5 * S)
    assert len(rec) == 1
    rows = rec.drain()
    assert rows.dtype == ITERATION_DTYPE
    assert rows.shape == (1,)
    r = rows[0]
    assert r["t_start"] == pytest.approx(6.0, abs=1e-12)
    assert r["t_end"] == pytest.approx(6.1, abs=1e-12)
    expected = {"data": 0.010, "h2d": 0.002, "forward": 0.018, "backward": 0.040, "comm": 0.010, "update": 0.010}
    for name, seconds in expected.items():
        assert r[name] == pytest.approx(seconds, abs=1e-12), name
    assert r["samples"] == 32
    assert r["loss"] == pytest.approx(0.5)
    assert not r["warmup"]
    assert r["comm_total"] == 0.0


def test_mark_uses_the_clock(clock: FakeClock) -> None:
    rec = Recorder(2, 0, 0)
    clock.push(1 * S)
    rec.start(warmup=True)
    clock.push(1 * S + 3 * MS)
    rec.mark(Phase.DATA)
    clock.push(1 * S + 9 * MS)
    rec.mark(Phase.FORWARD)
    clock.push(1 * S + 20 * MS)
    rec.stop(8)
    r = rec.drain()[0]
    assert r["t_start"] == pytest.approx(1.0, abs=1e-12)
    assert r["t_end"] == pytest.approx(1.020, abs=1e-12)
    assert r["data"] == pytest.approx(0.003, abs=1e-12)
    assert r["forward"] == pytest.approx(0.006, abs=1e-12)
    assert r["warmup"]


def test_unmarked_phases_are_zero(clock: FakeClock) -> None:
    rec = Recorder(4, 0, 0)
    start = 2 * S
    clock.push(start)
    rec.start()
    rec.mark_at(Phase.FORWARD, start + 40 * MS)  # data, h2d unmarked: forward takes it all
    rec.mark_at(Phase.UPDATE, start + 55 * MS)  # backward, comm unmarked
    clock.push(start + 60 * MS)
    rec.stop(1)
    clock.push(start + S)
    rec.start()  # nothing marked at all
    clock.push(start + S + 7 * MS)
    rec.stop(1)
    a, b = rec.drain()
    assert (a["data"], a["h2d"], a["backward"], a["comm"]) == (0.0, 0.0, 0.0, 0.0)
    assert a["forward"] == pytest.approx(0.040, abs=1e-12)
    assert a["update"] == pytest.approx(0.015, abs=1e-12)
    assert all(b[name] == 0.0 for name in PHASES)
    assert b["t_end"] - b["t_start"] == pytest.approx(0.007, abs=1e-12)


def test_phases_never_exceed_the_iteration(clock: FakeClock) -> None:
    rec = Recorder(8, 123 * S, 100 * S)
    rng = np.random.default_rng(7)
    for k in range(8):
        start = (10 + k) * S
        clock.push(start)
        rec.start()
        # random subset of phases, possibly out of order (a hook may report an earlier end)
        for phase in (Phase.DATA, Phase.H2D, Phase.FORWARD, Phase.BACKWARD, Phase.COMM, Phase.UPDATE):
            if rng.random() < 0.6:
                rec.mark_at(phase, start + int(rng.integers(0, 500)) * MS)
        clock.push(start + 600 * MS)
        rec.stop(4)
    rows = rec.drain()
    total = sum(rows[name] for name in PHASES)
    assert np.all(total <= rows["t_end"] - rows["t_start"] + 1e-12)
    for name in PHASES:
        assert np.all(rows[name] >= 0.0)


def test_marks_of_a_previous_row_do_not_leak_into_the_next(clock: FakeClock) -> None:
    rec = Recorder(1, 0, 0)
    clock.push(1 * S)
    rec.start()
    for phase in (Phase.DATA, Phase.H2D, Phase.FORWARD, Phase.BACKWARD, Phase.COMM, Phase.UPDATE):
        rec.mark_at(phase, 1 * S + phase * MS)
    rec.add_comm(3 * MS)
    clock.push(1 * S + 10 * MS)
    rec.stop(1, 0.25)
    first = rec.drain()[0]
    assert first["comm_total"] == pytest.approx(0.003)
    assert first["update"] == pytest.approx(0.001)
    clock.push(9 * S)
    rec.start()
    clock.push(9 * S + 50 * MS)
    rec.stop(1)
    r = rec.drain()[0]
    assert all(r[name] == 0.0 for name in PHASES)
    assert r["comm_total"] == 0.0
    assert math.isnan(r["loss"])


def test_time_conversion_with_realistic_clock_values(clock: FakeClock) -> None:
    # monotonic clock ~3.4 h after boot; wall clock ~2023; epoch taken 12000 s after boot
    mono = 12_345_678_901_234
    wall_minus_mono = 1_700_000_000 * S - 12_000 * S
    epoch = 1_700_000_000 * S
    rec = Recorder(1, wall_minus_mono, epoch)
    clock.push(mono)
    rec.start()
    clock.push(mono + 1_234)
    rec.stop(1)
    r = rec.drain()[0]
    # seconds since the epoch on the wall clock: mono + (wall - mono) - epoch
    assert r["t_start"] == pytest.approx(345.678901234, abs=1e-9)
    assert r["t_end"] - r["t_start"] == pytest.approx(1.234e-6, abs=1e-9)


def test_comm_total_sums_add_comm_per_iteration(clock: FakeClock) -> None:
    rec = Recorder(3, 0, 0)
    for k, parts in enumerate(([4 * MS, 6 * MS], [], [1 * MS])):
        clock.push(k * S)
        rec.start()
        for ns in parts:
            rec.add_comm(ns)
        clock.push(k * S + 100 * MS)
        rec.stop(1)
    rows = rec.drain()
    assert rows["comm_total"].tolist() == pytest.approx([0.010, 0.0, 0.001], abs=1e-12)


def test_samples_warmup_and_loss(clock: FakeClock) -> None:
    class Scalar:
        def __float__(self) -> float:
            return 2.25

    rec = Recorder(4, 0, 0)
    for k, (warm, samples, loss) in enumerate(
        [(True, 16, None), (False, 15, 1.5), (False, 16, np.float32(0.75)), (False, 3, Scalar())]
    ):
        clock.push(k * S)
        rec.start(warmup=warm)
        clock.push(k * S + MS)
        rec.stop(samples, loss)
    rows = rec.drain()
    assert rows["warmup"].tolist() == [True, False, False, False]
    assert rows["samples"].tolist() == [16, 15, 16, 3]
    assert math.isnan(rows["loss"][0])
    assert rows["loss"][1:].tolist() == pytest.approx([1.5, 0.75, 2.25])


def test_first_len_and_full_across_drains(clock: FakeClock) -> None:
    rec = Recorder(3, 0, 0)
    assert (rec.first, len(rec), rec.full) == (0, 0, False)

    def iterations(n: int) -> None:
        for _ in range(n):
            clock.push(S, 2 * S)
            rec.start()
            rec.stop(1)

    iterations(2)
    assert (len(rec), rec.full) == (2, False)
    assert len(rec.drain()) == 2
    assert (rec.first, len(rec), rec.full) == (2, 0, False)
    iterations(3)
    assert rec.full
    assert len(rec.drain()) == 3
    assert (rec.first, rec.full) == (5, False)
    assert len(rec.drain()) == 0  # an empty drain is fine and does not advance
    assert rec.first == 5


def test_null_recorder_records_nothing(clock: FakeClock) -> None:
    rec = NullRecorder(2, 0, 0)
    rec.start()
    rec.mark(Phase.DATA)
    rec.mark_at(Phase.COMM, 5)
    rec.add_comm(5)
    rec.stop(3, 1.0)
    assert len(rec) == 0
    assert len(rec.drain()) == 0
