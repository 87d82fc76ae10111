"""Energy recorded with the timings (the `/energy` table, provenance `energy_sources`) and carried
into the figures (hpcbench.analysis.energy): real point runs on this machine (no RAPL, no GPU:
every source absent, and a FAKE powercap tree through HPCBENCH_POWERCAP_ROOT), the rank's meter
with FAKE readers, and fabricated point files of known joules."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from hpcbench.analysis import energy, pipeline, tables
from hpcbench.analysis.export.summary import COLUMNS, UNITS, Summary
from hpcbench.analysis.report import html
from hpcbench.cli.analyze import format_table
from hpcbench.spec import Point
from hpcbench.store import schema
from hpcbench.store.reader import PointData, read_point
from hpcbench.store.writer import parallel_hdf5_available
from hpcbench.testing.fabricate import write_point_file
from hpcbench.trace.energy.meter import ROOT_VARIABLE, EnergyMeter
from tests.conftest import run_module, run_sweep, spec_text
from tests.unit.test_energy import FakeNvml, set_energy, write_fake_powercap

GPU_LOST = 15  # pynvml.NVML_ERROR_GPU_IS_LOST


# ------------------------------------------------------------------------------ real point runs


@pytest.mark.mpi
def test_a_real_run_without_energy_sources_records_an_empty_table_and_says_why(
    write_spec: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "no-powercap"  # as on a VM: no powercap tree (whatever this machine has)
    monkeypatch.setenv(ROOT_VARIABLE, str(missing))
    text = spec_text("energy", {"ranks_per_node": [2]}, framework="synthetic", backend="none", model="sleep",
                     iterations=4, warmup=1)  # fmt: skip
    out = tmp_path / "sweep"
    (p,) = run_sweep(write_spec, out, text)
    assert p.energy.dtype == schema.ENERGY_DTYPE and len(p.energy) == 0
    rapl_absent = f"absent: no {missing} (no RAPL: a VM or a kernel without powercap)"
    assert p.provenance["energy_sources"] == [
        {"rapl": rapl_absent, "nvml": "not read: the point runs on the CPU"},
        {"rapl": "not read: local rank 0 reads its host's", "nvml": "not read: the point runs on the CPU"},
    ]
    res = run_module("hpcbench.analyze", str(out))
    assert res.returncode == 0, res.stderr
    said = [line for line in res.stdout.splitlines() if "energy:" in line]
    assert said == [f"note: energy: not measured: no energy source was read: rapl: {rapl_absent}; "
                    "nvml: not read: the point runs on the CPU"]  # fmt: skip
    assert "J/sample" not in res.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("writer", ["gather", "mpio"])
def test_a_real_run_reads_a_fake_powercap_tree_at_the_loop_edges(
    writer: str, write_spec: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FAKE powercap tree whose counters never move: the path from the reader to the file,
    through either writer; two ranks on this host, the local rank 0 reads it."""
    if writer == "mpio" and not parallel_hdf5_available():
        pytest.skip("h5py is built without MPI here")
    fake = tmp_path / "fake_sys_class_powercap"
    write_fake_powercap(fake, {0: {"package-0": 5_000_000, "dram": 700_000}})
    monkeypatch.setenv(ROOT_VARIABLE, str(fake))
    text = spec_text("energy", {"ranks_per_node": [2]}, framework="synthetic", backend="none", model="sleep",
                     iterations=4, warmup=1, extra={"forward_s": 0.002}, options={"writer": writer})  # fmt: skip
    out = tmp_path / "sweep"
    (p,) = run_sweep(write_spec, out, text)
    assert p.provenance["writer"] == writer
    cpu = "not read: the point runs on the CPU"
    assert p.provenance["energy_sources"] == [
        {"rapl": "package-0, dram-0 (readable)", "nvml": cpu},
        {"rapl": "not read: local rank 0 reads its host's", "nvml": cpu},
    ]
    rows = p.energy
    # when the loop begins, when warm-up ends, at the flush of the 4 iterations (inside the loop)
    # and when the loop ends: each domain every time
    assert [(r["source"], r["domain"], r["microjoules"]) for r in rows] == [
        (b"rapl", b"package-0", 5_000_000), (b"rapl", b"dram-0", 700_000)
    ] * 4  # fmt: skip
    assert (rows["rank"] == 0).all()
    t = rows["t"][::2]
    assert t[0] < p.iterations["t_start"][0, 0] and p.iterations["t_end"][0, 0] <= t[1] <= p.iterations["t_start"][0, 1]
    assert p.iterations["t_end"][0, -1] <= t[2] <= t[3]
    figures = energy.row(p)  # counters that did not move: 0 J over a window of 3 timed iterations
    assert (figures["energy_j"], figures["power_cpu_w"], figures["power_dram_w"]) == (0.0, 0.0, 0.0)
    assert figures["energy_note"] == "" and math.isnan(figures["power_gpu_w"])
    res = run_module("hpcbench.analyze", str(out))
    assert res.returncode == 0, res.stderr
    assert "J/sample" in res.stdout and "energy: not measured" not in res.stdout
    if writer == "gather":  # the raw readings exported as they are in the file (once: the writers agree above)
        import pyarrow.parquet as pq

        res = run_module("hpcbench", "export", str(out), "--format", "parquet", "-o", str(tmp_path / "export"))
        assert res.returncode == 0, res.stderr
        table = pq.read_table(tmp_path / "export" / "energy.parquet").to_pydict()
        assert table["microjoules"] == rows["microjoules"].tolist()
        assert table["domain"] == [d.decode() for d in rows["domain"]] and set(table["point"]) == {p.point_id}
        assert table["t_ns"] == [round(t * 1e9) for t in rows["t"]]


# --------------------------------------------------------------------------------- the meter


def test_the_meter_reads_rapl_on_local_rank_0_and_the_gpu_and_a_failing_reader_stops_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "fake_sys_class_powercap"
    write_fake_powercap(root, {0: {"package-0": 1_000, "dram": 200}})
    nvml = FakeNvml(energy_mj=[10, 10, 15])  # FAKE GPU: the probe at open, then the reads
    meter = EnergyMeter(3, 0, 0, local_rank=0, gpu_index=0, root=str(root), nvml=nvml)
    assert meter.sources == {
        "rapl": "package-0, dram-0 (readable)",
        "nvml": "GPU 0 (Fake GPU): total-energy counter (nvmlDeviceGetTotalEnergyConsumption)",
    }
    meter.read()
    set_energy(root, "intel-rapl:0", 4_000)
    meter.read()
    nvml.energy_error = GPU_LOST
    meter.read()  # the GPU is lost: its reader stops, RAPL goes on
    rows = meter.drain()
    assert rows.dtype == schema.ENERGY_DTYPE and (rows["rank"] == 3).all()
    assert [(r["source"].decode(), r["domain"].decode(), int(r["microjoules"])) for r in rows] == [
        ("rapl", "package-0", 1_000), ("rapl", "dram-0", 200), ("nvml-counter", "gpu-0", 10_000),
        ("rapl", "package-0", 4_000), ("rapl", "dram-0", 200), ("nvml-counter", "gpu-0", 15_000),
        ("rapl", "package-0", 4_000), ("rapl", "dram-0", 200),
    ]  # fmt: skip
    assert np.all(np.diff(rows["t"]) >= 0)
    assert meter.errors == 1 and meter.sources["nvml"].endswith("; stopped: NVMLError_GpuIsLost: GPU is lost")
    assert "rank 3: energy source nvml stopped" in capsys.readouterr().err
    assert len(meter.drain()) == 0
    meter.close()
    assert nvml.initialised == 0


def test_the_meter_of_another_local_rank_leaves_rapl_to_local_rank_0(tmp_path: Path) -> None:
    write_fake_powercap(tmp_path / "powercap", {0: {"package-0": 1_000}})
    meter = EnergyMeter(1, 0, 0, local_rank=1, gpu_index=None, root=str(tmp_path / "powercap"))
    assert meter.sources == {"rapl": "not read: local rank 0 reads its host's",
                             "nvml": "not read: the point runs on the CPU"}  # fmt: skip
    meter.read()
    assert not meter.reading and len(meter.drain()) == 0


# ----------------------------------------------------------------- fabricated files, known joules

N_RANKS, N_ITERS, BATCH = 2, 4, 8  # iteration i runs from i s to i + 1 s; iteration 0 is warm-up


def iterations() -> np.ndarray:
    it = np.zeros((N_RANKS, N_ITERS), dtype=schema.ITERATION_DTYPE)
    it["t_start"] = np.arange(N_ITERS, dtype=float)
    it["t_end"] = it["t_start"] + 1.0
    it["forward"] = 0.9
    it["samples"] = BATCH
    it["warmup"][:, 0] = 1
    return it


def reading(rank: int, t: float, source: str, domain: str, joules: float) -> tuple[Any, ...]:
    return (rank, t, source.encode(), domain.encode(), round(joules * 1e6))


def known_joules(gpu_end: float = 4.0) -> np.ndarray:
    """Each rank's gpu-0 (a host each) 300 J over the 3 s timed window; host a's package-0 90 J and
    dram-0 30 J, its core-0 (inside the package) 50 J; the readings when the loop began (t = 0,
    before warm-up ended: not counted), when warm-up ended (t = 1), at a flush and at the end."""
    rows = []
    for rank in range(N_RANKS):
        rows += [reading(rank, 0.0, "nvml-counter", "gpu-0", 0.0), reading(rank, 1.0, "nvml-counter", "gpu-0", 1000.0),
                 reading(rank, 2.5, "nvml-counter", "gpu-0", 1150.0),
                 reading(rank, gpu_end, "nvml-counter", "gpu-0", 1300.0)]  # fmt: skip
    for t, package, dram, core in ((0.0, 0, 0, 0), (1.0, 500, 100, 200), (4.0, 590, 130, 250)):
        rows += [reading(0, t, "rapl", "package-0", package), reading(0, t, "rapl", "dram-0", dram),
                 reading(0, t, "rapl", "core-0", core)]  # fmt: skip
    return np.array(rows, dtype=schema.ENERGY_DTYPE)


def fabricated(path: Path, rows: np.ndarray | None, **provenance: Any) -> PointData:
    point = Point(framework="torch", backend="nccl", model="lenet", device="cuda", batch_size=BATCH,
                  iterations=N_ITERS - 1, warmup=1, ranks_per_node=1, nodes=N_RANKS)  # fmt: skip
    write_point_file(path, point, iterations(), energy=rows, hostnames=["a", "b"], provenance=provenance)
    return read_point(path)


def test_known_joules_give_energy_per_sample_and_power(tmp_path: Path) -> None:
    p = fabricated(tmp_path / "p.h5", known_joules())
    assert len(p.energy) == 2 * 4 + 3 * 3
    figures = energy.row(p)
    assert figures["energy_note"] == ""
    assert figures["energy_j"] == pytest.approx(300 + 300 + 90 + 30)  # the cores are inside the package
    timed_samples = N_RANKS * (N_ITERS - 1) * BATCH
    assert figures["energy_per_sample_j"] == pytest.approx(720 / timed_samples)
    assert math.isnan(figures["energy_per_token_j"])  # an image model
    assert figures["power_gpu_w"] == pytest.approx(100.0)
    assert figures["power_cpu_w"] == pytest.approx(30.0)
    assert figures["power_dram_w"] == pytest.approx(10.0)
    tokens = energy.row(fabricated(tmp_path / "tokens.h5", known_joules(), tokens_per_sample=10))
    assert tokens["energy_per_token_j"] == pytest.approx(720 / timed_samples / 10)


def test_a_window_shorter_than_the_update_interval_is_untrusted(tmp_path: Path) -> None:
    rows = known_joules()
    late = (rows["domain"] == b"gpu-0") & (rows["rank"] == 1) & (rows["t"] >= 2.0)
    rows = rows[~late]
    rows = np.concatenate([rows, np.array([reading(1, 1.05, "nvml-counter", "gpu-0", 1001.0)], schema.ENERGY_DTYPE)])
    figures = energy.row(fabricated(tmp_path / "p.h5", rows))
    assert all(math.isnan(figures[c]) for c in energy.COLUMNS if not c.endswith("_note"))  # never shown as measured
    assert figures["energy_note"] == (
        "untrusted: nvml-counter gpu-0 of rank 1 on b: a 50 ms window is shorter than the counter's update "
        "interval (100 ms): the counter may not have moved within it"
    )


def test_the_figures_join_the_stats_table_the_summary_and_analyze(tmp_path: Path) -> None:
    with_energy = fabricated(tmp_path / "with.h5", known_joules())
    without = fabricated(tmp_path / "without.h5", None, energy_sources=[{"rapl": "absent: no /x", "nvml": "absent: y"}])
    stats = tables.stats_table([with_energy])
    assert stats.loc[0, "power_gpu_w"] == pytest.approx(100.0)
    summary = Summary()
    summary.add(with_energy)
    assert summary.table().loc[0, "power_cpu_w"] == pytest.approx(30.0)
    assert set(energy.COLUMNS) <= set(COLUMNS) and UNITS["energy_per_sample_j"] == "J"
    assert "J/sample" in format_table(stats) and "GPU W" in format_table(stats)
    assert energy.sweep_note(stats) == ""
    none = tables.stats_table([without])
    assert "J/sample" not in format_table(none)
    assert (
        energy.sweep_note(none)
        == "energy: not measured: no energy source was read: rapl: absent: no /x; nvml: absent: y"
    )
    old = fabricated(tmp_path / "old.h5", None)
    assert energy.row(old)["energy_note"] == "written before hpcbench recorded energy"


def test_energy_add_on_an_empty_table_has_the_columns() -> None:
    assert list(energy.add(pd.DataFrame(columns=["point"]), [])) == ["point", *energy.COLUMNS]


def test_the_report_has_an_energy_section_or_one_note_why_not(tmp_path: Path) -> None:
    measured, unmeasured = tmp_path / "measured", tmp_path / "unmeasured"
    for directory, rows in ((measured, known_joules()), (unmeasured, None)):
        directory.mkdir()
        p = fabricated(directory / "p.h5", rows, energy_sources=[{"rapl": "absent: no /x", "nvml": "absent: y"}])
        (directory / "p.h5").rename(directory / f"{p.point_id}.h5")
    with_it = pipeline.analyse(measured)
    energy_sections = [s for s in html.sections(with_it) if s.title == "Energy"]
    assert len(energy_sections) == 1 and not any("energy" in n for n in html.notes(with_it))
    assert "J/sample" in html.render_markdown(with_it, [])
    figure = dict(html.draw(with_it))["Energy per sample vs ranks"]
    assert figure is not None
    timed_samples = N_RANKS * (N_ITERS - 1) * BATCH
    assert figure.data["energy_per_sample_j"].tolist() == pytest.approx([720 / timed_samples])
    assert figure.data["ranks"].tolist() == [N_RANKS]
    without = pipeline.analyse(unmeasured)
    assert dict(html.draw(without))["Energy per sample vs ranks"] is None  # no axis drawn empty
    assert "Energy" not in [s.title for s in html.sections(without)]
    said = [n for n in html.notes(without) if "energy" in n]
    assert said == ["energy: not measured: no energy source was read: rapl: absent: no /x; nvml: absent: y"]
    assert "- note: energy: not measured" in html.render_markdown(without, [])


def test_compare_on_energy_per_sample_is_power_times_the_step(tmp_path: Path) -> None:
    """`compare --metric energy_per_sample_j`: the point's power over its timed window (720 J
    in 3 s) times its step (1 s) per sample of an iteration (2 ranks x 8): the same 15 J as the
    analysis' energy / samples when every step is alike; undefined without energy."""
    from hpcbench.analysis import compare

    p = fabricated(tmp_path / "p.h5", known_joules())
    without = fabricated(tmp_path / "without.h5", None, energy_sources=[{"rapl": "absent: no /x", "nvml": "absent: y"}])
    assert energy.watts(p) == pytest.approx(240.0) and math.isnan(energy.watts(without))
    (config,) = compare.configurations([p], list(compare.IGNORED_FIELDS))[0].values()
    metric = compare.metric_named("energy_per_sample_j")
    assert config.runs[0].value(metric) == pytest.approx(15.0) == pytest.approx(energy.row(p)["energy_per_sample_j"])
    assert not metric.higher_is_better
    (config,) = compare.configurations([without], list(compare.IGNORED_FIELDS))[0].values()
    assert math.isnan(config.runs[0].value(metric))


def test_power_sampling_as_mlperf_power_asks_or_why_not(tmp_path: Path) -> None:
    """The sampler's GPU power readings in each rank's timed window (1 s to 4 s here): every
    0.5 s is 2 Hz but 7 samples, short of MLPerf power's 60; every 2 s, 0.5 Hz, short of both;
    none (the CPU) says the sampler reads GPU power only."""
    from hpcbench.testing.arrays import _no_sources

    def sampled(name: str, period: float) -> dict[str, Any]:
        times = np.arange(0.0, 4.0 + 1e-9, period)
        res = _no_sources(N_RANKS * len(times))
        res["rank"] = np.repeat(np.arange(N_RANKS), len(times))
        res["t"] = np.tile(times, N_RANKS)
        res["gpu_power_w"] = 250.0
        point = Point(framework="torch", backend="nccl", model="lenet", device="cuda", batch_size=BATCH,
                      iterations=N_ITERS - 1, warmup=1, ranks_per_node=1, nodes=N_RANKS)  # fmt: skip
        write_point_file(tmp_path / name, point, iterations(), resources=res, hostnames=["a", "b"])
        return energy.power_sampling(read_point(tmp_path / name))

    fast = sampled("fast.h5", 0.5)
    assert (fast["power_samples"], fast["power_sample_hz"]) == (7, pytest.approx(7 / 3))
    assert fast["power_note"] == "7 samples, under 60: train longer"
    slow = sampled("slow.h5", 2.0)
    assert slow["power_samples"] == 2 and slow["power_note"].startswith("0.67 Hz, under 1 Hz")
    cpu = energy.power_sampling(fabricated(tmp_path / "cpu.h5", known_joules()))
    assert math.isnan(cpu["power_samples"]) and cpu["power_note"].startswith("no power samples")
