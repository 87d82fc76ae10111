"""α–β per network level from commbench files written by the real commbench writer with known
α, β and noise: intra from all ranks on one node, inter from one rank per node; the fit refuses
a β it cannot tell from noise; `hpcbench predict` takes the files as its links."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd
import pytest
import yaml

from hpcbench.analysis.model import forecast, forecast_spec
from hpcbench.analysis.model import linkfit as calibration
from hpcbench.analysis.model.collectives import LinkCost
from hpcbench.cli.commbench import write_results
from hpcbench.errors import SpecError
from hpcbench.store.commfile import KIND, RESULT_DTYPE, VERSION, bus_bandwidth

SIZES = [4096, 65536, 1 << 20, 4 << 20, 16 << 20]
INTRA = LinkCost(alpha=2e-6, beta=1 / 20e9)  # 20 GB/s, 2 µs
INTER = LinkCost(alpha=50e-6, beta=8 / 10e9)  # 10 Gbit/s, 50 µs


def ring(n: float, p: int, link: LinkCost) -> float:
    """A ring all-reduce of n bytes on p ranks, worked out by hand rather than taken from the model
    under test: a reduce-scatter and an all-gather of p − 1 steps each (2(p − 1) latencies), in
    which every rank sends 2n(p − 1)/p bytes."""
    return 2 * (p - 1) * link.alpha + 2 * n * (p - 1) / p * link.beta


def fabricate(
    path: Path, hosts: list[str], link: LinkCost | None, noise: float, seed: int, flat: float = 0.0,
    cost: Callable[[float, int, LinkCost], float] = ring, mpi: dict[str, str] | None = None,
) -> Path:  # fmt: skip
    """A commbench file of len(hosts) ranks: all-reduce times (`cost`, a ring unless told) of
    `link` times (1 + noise·N(0,1)), or, with `flat`, every size costing `flat` seconds give or
    take the noise; `mpi`: the attributes that name the MPI library and its settings."""
    rng = np.random.default_rng(seed)
    p = len(hosts)
    rows = np.zeros(len(SIZES), dtype=RESULT_DTYPE)
    for i, n in enumerate(SIZES):
        truth = cost(n, p, link) if link is not None else flat
        t = truth * (1 + noise * rng.standard_normal())
        algbw, busbw = bus_bandwidth("allreduce", n, t, p)
        rows[i] = ("allreduce", p, n, n // 4, t, t * 0.95, t * 1.05, algbw, busbw)
    attrs = {"kind": KIND, "version": VERSION, "ranks": p, "hostnames": hosts, "backend": "mpi", "device": "cpu",
             "average": "avg", "iterations": 20, "warmup": 5, "launcher": "mpirun", **(mpi or {})}  # fmt: skip
    write_results(path, rows, attrs)
    return path


@pytest.fixture
def machine(tmp_path: Path) -> dict[str, list[Path]]:
    """Intra files (2 and 4 ranks on one node) and inter files (2, 4, 8 nodes, one rank each), 3 % noise."""
    intra = [fabricate(tmp_path / f"intra{p}.h5", ["n0"] * p, INTRA, 0.03, seed=p) for p in (2, 4)]
    inter = [fabricate(tmp_path / f"inter{p}.h5", [f"n{i}" for i in range(p)], INTER, 0.03, seed=10 + p)
             for p in (2, 4, 8)]  # fmt: skip
    return {"intra": intra, "inter": inter}


def test_placement_from_the_hostnames(tmp_path: Path) -> None:
    cases = {("a", "a"): (1, 2, "intra"), ("a", "b", "c"): (3, 1, "inter"), ("a", "a", "b", "b"): (2, 2, None)}
    for i, (hosts, (nodes, per_node, level)) in enumerate(cases.items()):
        where = calibration.placement(fabricate(tmp_path / f"{i}.h5", list(hosts), INTER, 0.0, seed=i))
        assert (where.ranks, where.nodes, where.ranks_per_node, where.level) == (len(hosts), nodes, per_node, level)


def test_each_level_recovers_its_known_link(machine: dict[str, list[Path]]) -> None:
    fits = calibration.levels_from_commbench(machine["intra"] + machine["inter"])
    assert set(fits) == {"intra", "inter"}
    truths: tuple[tuple[calibration.Level, LinkCost], ...] = (("intra", INTRA), ("inter", INTER))
    for level, truth in truths:
        fit = fits[level]
        assert set(fit.files) == set(machine[level])
        # 3 % noise on each time: β (set by the large sizes) within 5 %, α within a few µs
        assert fit.link.beta == pytest.approx(truth.beta, rel=0.05)
        assert fit.link.alpha == pytest.approx(truth.alpha, abs=max(0.5 * truth.alpha, 3e-6))
        assert fit.beta_t >= calibration.MIN_T


def test_a_flat_time_is_refused_not_fitted_as_infinite_bandwidth(tmp_path: Path) -> None:
    # what a loaded host gave: every size about 0.5 ms, the largest not slower than the smallest
    flat = [fabricate(tmp_path / f"flat{p}.h5", ["n0"] * p, None, 0.2, seed=p, flat=5e-4) for p in (2, 3)]
    with pytest.raises(calibration.CalibrationError) as info:
        calibration.link_from_commbench(flat)
    message = str(info.value)
    assert "cannot be told from noise" in message and "4 KiB" in message and "16 MiB" in message
    assert "standard errors" in message
    with pytest.raises(calibration.CalibrationError, match="cannot be told from noise"):
        calibration.levels_from_commbench(flat)


def test_mixed_placements_are_named_and_left_out(tmp_path: Path, machine: dict[str, list[Path]]) -> None:
    mixed = fabricate(tmp_path / "mixed.h5", ["a", "a", "b", "b"], INTER, 0.0, seed=1)
    fits = calibration.levels_from_commbench([*machine["inter"], mixed])
    assert set(fits) == {"inter"}
    assert any("mixed.h5" in note and "mixes both levels" in note for note in fits["inter"].notes)
    assert "mixed.h5: 2 nodes × 2 ranks per node (mixes both levels): not used" in fits["inter"].describe()
    with pytest.raises(calibration.CalibrationError, match="neither all ranks on one node"):
        calibration.levels_from_commbench([mixed])


def test_predict_takes_the_commbench_files_as_its_links(tmp_path: Path, machine: dict[str, list[Path]]) -> None:
    files = [str(p.relative_to(tmp_path)) for p in machine["intra"] + machine["inter"]]
    raw: dict[str, Any] = {"layers": [[8e6, 0.01]], "batch_size": 8,
           "single_rank": {"phases": {"forward": 0.005, "backward": 0.01}}, "ranks_per_node": 4, "nodes": [1, 4],
           "links": {"from_commbench": files},
           "exchange": {"overlap": False, "algorithm": "hierarchical"}}  # fmt: skip
    spec_file = tmp_path / "predict.yaml"
    spec_file.write_text(yaml.safe_dump(raw))
    spec = forecast_spec.load(str(spec_file))  # paths relative to the prediction file
    fits = calibration.levels_from_commbench(machine["intra"] + machine["inter"])
    assert spec.intra.link == fits["intra"].link and spec.inter.link == fits["inter"].link
    # what each level was fitted on, and how, is said beside the table
    intra, inter = spec.link_notes
    assert intra.startswith("intra: α ") and "fitted on intra2.h5, intra4.h5 (10 rows" in intra
    assert "Gbit/s per hop" in inter and "inter2.h5, inter4.h5, inter8.h5 (15 rows" in inter
    rate = float(inter.split("β ")[1].split(" Gbit/s")[0])
    assert rate == pytest.approx(8 / INTER.beta / 1e9, rel=0.05)  # 10 Gbit/s, through the fit
    # the files name no MPI library: costed as a ring, and said so
    assert "costed as a ring (mpi's all-reduce: the file records no algorithm)" in inter
    table = forecast.forecast(spec)
    one, four = table["comm_total_s"].tolist()
    # the known link, through the fit: a ring on one node of 4 ranks, 6α + 1.5·8e6·β = 12 µs + 600 µs
    assert one == pytest.approx(612e-6, rel=0.08)
    assert four > one
    # a level stated beside the files wins over the fitted one
    raw["links"]["inter"] = {"bandwidth_gbps": 100, "latency_us": 1}
    spec_file.write_text(yaml.safe_dump(raw))
    stated_spec = forecast_spec.load(str(spec_file))
    stated = stated_spec.inter.link
    assert stated is not None and stated.beta == pytest.approx(8e-11)
    assert [note.split(":")[0] for note in stated_spec.link_notes] == ["intra"]  # the stated one is not a fit


@pytest.mark.parametrize(
    ("value", "path", "words"),
    [
        ([], "links.from_commbench", ["non-empty list"]),
        (["missing.h5"], "links.from_commbench[0]", ["is not a file"]),
    ],
)
def test_bad_commbench_links_name_the_key(tmp_path: Path, value: object, path: str, words: list[str]) -> None:
    raw = {"layers": [[1e6, 0.01]], "batch_size": 8, "single_rank": {"throughput": 100.0}, "nodes": [1],
           "links": {"from_commbench": value}}  # fmt: skip
    with pytest.raises(SpecError) as info:
        forecast_spec.parse(yaml.safe_dump(raw), tmp_path)
    assert info.value.path == path
    assert all(word in str(info.value) for word in words)


def open_mpi_41(n: float, p: int, link: LinkCost) -> float:
    """Open MPI 4.1's all-reduce of the test's sizes on 2 and 4 ranks, worked out by hand from its
    rules: on 2 ranks every size costs 2α + nβ (a ring from 4 to 256 KiB, Rabenseifner's above:
    the same there); on 4 ranks 4 KiB is recursive doubling (2α + 2nβ), the rest Rabenseifner's
    (4α + 1.5nβ)."""
    assert p in (2, 4)
    if p == 2:
        return 2 * link.alpha + n * link.beta
    return 2 * link.alpha + 2 * n * link.beta if n < 8192 else 4 * link.alpha + 1.5 * n * link.beta


OPEN_MPI = {"mpi": "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4", "mpi_environment": "{}"}


def test_a_file_that_names_open_mpi_is_fitted_with_its_algorithms(tmp_path: Path) -> None:
    files = [fabricate(tmp_path / f"{p}.h5", [f"n{i}" for i in range(p)], INTER, 0.0, seed=p, cost=open_mpi_41,
                       mpi=OPEN_MPI) for p in (2, 4)]  # fmt: skip
    assert [calibration.rules(f) for f in files] == ["open-mpi-4.1"] * 2
    assert calibration.costed_as(files[0]) == "open-mpi-4.1's algorithm for each size and rank count"
    fit = calibration.levels_from_commbench(files)["inter"]
    assert fit.link.alpha == pytest.approx(INTER.alpha, rel=1e-6)
    assert fit.link.beta == pytest.approx(INTER.beta, rel=1e-6)
    # the same times taken for a ring's (6 α steps on 4 ranks where Open MPI took 2 or 4) miss α
    as_ring = pd.concat([calibration.read_commbench(f) for f in files], ignore_index=True).assign(rules="")
    ring = calibration.fit_link(as_ring)[0]
    assert abs(ring.alpha / INTER.alpha - 1) > 0.2


@pytest.mark.parametrize(("backend", "words"), [("gloo", "a ring (gloo's all-reduce: the file records no algorithm)"),
                                                 ("nccl", "a ring (nccl's all-reduce")])  # fmt: skip
def test_gloo_and_nccl_files_are_costed_as_a_ring_and_say_so(tmp_path: Path, backend: str, words: str) -> None:
    files = [fabricate(tmp_path / f"{p}.h5", ["n0"] * p, INTRA, 0.0, seed=p) for p in (2, 4)]
    for path in files:
        with h5py.File(path, "a") as f:
            f.attrs["backend"] = backend
    fit = calibration.levels_from_commbench(files)["intra"]
    assert fit.link.beta == pytest.approx(INTRA.beta, rel=1e-6)
    assert words in calibration.costed_as(files[0])
    assert fit.describe().endswith(f"all-reduce costed as {calibration.costed_as(files[0])})")
    assert "β at over 1000 standard errors" in fit.describe()  # no noise: a perfect fit


def test_a_forced_ring_is_fitted_as_a_ring(tmp_path: Path) -> None:
    forced = {**OPEN_MPI, "mpi_environment": json.dumps(
        {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1", "OMPI_MCA_coll_tuned_allreduce_algorithm": "4"})}  # fmt: skip
    files = [fabricate(tmp_path / f"{p}.h5", [f"n{i}" for i in range(p)], INTER, 0.0, seed=p, mpi=forced)
             for p in (2, 4)]  # fmt: skip
    assert calibration.rules(files[0]) == "forced:ring"
    assert calibration.costed_as(files[0]) == "ring (forced by the file's MPI settings)"
    fit = calibration.levels_from_commbench(files)["inter"]
    assert fit.link.alpha == pytest.approx(INTER.alpha, rel=1e-6)
    assert fit.link.beta == pytest.approx(INTER.beta, rel=1e-6)


def test_what_decides_the_costing_is_the_library_the_file_records(tmp_path: Path) -> None:
    # a library whose rules are not known: a ring, and the file's own words for the library
    intel = {"mpi": "Intel(R) MPI Library 2021.6 for Linux* OS", "mpi_environment": "{}"}
    named = fabricate(tmp_path / "intel.h5", ["n0", "n1"], INTER, 0.0, seed=1, mpi=intel)
    assert calibration.rules(named) == ""
    assert calibration.costed_as(named) == (
        "a ring (the file names Intel(R) MPI Library 2021.6 for Linux* OS, whose algorithms are not known)"
    )
    # the library's rules, whatever the name of the file's backend
    known = fabricate(tmp_path / "known.h5", ["n0", "n1"], INTER, 0.0, seed=1, mpi=OPEN_MPI)
    with h5py.File(known, "a") as f:
        f.attrs["backend"] = "a-plugin"
    assert calibration.rules(known) == "open-mpi-4.1"
