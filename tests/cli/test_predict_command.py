"""`hpcbench predict`: from a YAML description alone, and from a measured sweep, against
numbers worked out by hand; bad input exits 2 naming the key."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
import yaml

from hpcbench.analysis.model import forecast, forecast_spec
from hpcbench.analysis.model.collectives import LinkCost
from hpcbench.errors import SpecError
from hpcbench.testing.arrays import ALPHA, BATCH, BETA, model_point
from tests.conftest import run_module

TWO_LAYERS = {
    "layers": [[4e6, 0.010], [1e6, 0.020]],  # input side first: 1 MB ready first, then 4 MB
    "batch_size": 32,
    "single_rank": {"phases": {"forward": 0.015, "backward": 0.030, "update": 0.005}},
    "ranks_per_node": 2,
    "nodes": [1, 4],
    "links": {
        "intra": {"alpha_s": 1e-5, "beta_s_per_byte": 1e-10},
        "inter": {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9},
    },
    "exchange": {"overlap": True, "fusion_bytes": 0, "algorithm": "ring"},
}


def ring(n: float, p: int, alpha: float, beta: float) -> float:
    return 2 * (p - 1) * alpha + 2 * n * (p - 1) / p * beta


def test_a_yaml_alone_gives_the_hand_worked_table(tmp_path: Path) -> None:
    spec = tmp_path / "two.yaml"
    spec.write_text(yaml.safe_dump(TWO_LAYERS))
    out = tmp_path / "two.csv"
    res = run_module("hpcbench", "predict", str(spec), "--csv", str(out))
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert list(rows[0])[:6] == ["nodes", "ranks", "t_iter_s", "throughput", "efficiency", "exposed_comm_s"]
    one, four = rows
    # 1 node x 2 ranks: intra link. The 1 MB gradient is ready at 20 ms, the 4 MB one at 30 ms.
    c1, c4 = ring(1e6, 2, 1e-5, 1e-10), ring(4e6, 2, 1e-5, 1e-10)
    exposed = max(0.020 + c1, 0.030) + c4 - 0.030
    assert float(one["exposed_comm_s"]) == pytest.approx(exposed)
    assert float(one["t_iter_s"]) == pytest.approx(0.015 + 0.030 + 0.005 + exposed)
    # 4 nodes x 2 ranks: a flat ring of 8 over the network's α and β
    c1, c4 = ring(1e6, 8, 1e-4, 1e-9), ring(4e6, 8, 1e-4, 1e-9)
    exposed = max(0.020 + c1, 0.030) + c4 - 0.030
    t = 0.050 + exposed
    assert float(four["t_iter_s"]) == pytest.approx(t)
    assert float(four["throughput"]) == pytest.approx(8 * 32 / t)
    assert float(four["efficiency"]) == pytest.approx(0.050 / t)
    assert float(four["t_iter_no_overlap_s"]) == pytest.approx(0.050 + c1 + c4)
    assert "efficiency" in res.stdout and "no overlap" in res.stdout


def test_an_mpi_librarys_own_choice_per_message() -> None:
    """Open MPI 4.1 on 4 nodes x 2 ranks (8 ranks, the network's α and β): the 1 MB and 4 MB
    gradients go by Rabenseifner's algorithm, 2·lg 8 = 6 steps and 2·7/8 of the bytes; a ring
    takes 14 steps. MPICH and a ring for comparison, worked out by hand."""
    raw = {**TWO_LAYERS, "nodes": [4], "exchange": {"overlap": False, "algorithm": "open-mpi-4.1"}}
    table = forecast.forecast(forecast_spec.parse(yaml.safe_dump(raw)))
    rabenseifner = sum(6 * 1e-4 + 2 * n * 7 / 8 * 1e-9 for n in (1e6, 4e6))
    assert table["comm_total_s"].iloc[0] == pytest.approx(rabenseifner)
    raw["exchange"] = {"overlap": False, "algorithm": "ring"}
    ring_total = forecast.forecast(forecast_spec.parse(yaml.safe_dump(raw)))["comm_total_s"].iloc[0]
    assert ring_total == pytest.approx(sum(ring(n, 8, 1e-4, 1e-9) for n in (1e6, 4e6)))
    assert ring_total - rabenseifner == pytest.approx(2 * (14 - 6) * 1e-4)  # the same bytes, 8 more steps each


def test_published_fits_are_used_as_they_are() -> None:
    raw = {**TWO_LAYERS, "nodes": [4], "links": {"inter": {"fits": {8: [1e-3, 2e-9]}}}}
    raw["exchange"] = {"fusion_bytes": "all"}
    table = forecast.forecast(forecast_spec.parse(yaml.safe_dump(raw)))
    assert table["comm_total_s"].iloc[0] == pytest.approx(1e-3 + 2e-9 * 5e6)  # one message of all 5 MB
    assert table["messages"].iloc[0] == 1


def test_a_zoo_model_and_a_throughput_are_enough() -> None:
    raw = {"model": "resnet50", "batch_size": 64, "single_rank": {"throughput": 256.0}, "nodes": [1],
           "links": {"intra": {"bandwidth_gbps": 100, "latency_us": 5}}}  # fmt: skip
    table = forecast.forecast(forecast_spec.parse(yaml.safe_dump(raw)))
    assert table["t_iter_s"].iloc[0] == pytest.approx(64 / 256.0)  # one rank: no exchange
    assert table["messages"].iloc[0] == 107  # ResNet-50's weighted layers, one message each


@pytest.mark.parametrize(
    ("change", "path", "words"),
    [
        ({"bogus": 1}, "spec.bogus", ["unknown key"]),
        ({"nodes": []}, "nodes", ["non-empty list"]),
        ({"nodes": [0]}, "nodes[0]", ["positive integer"]),
        ({"exchange": {"algorithm": "star"}}, "exchange.algorithm", ["'star'", "hierarchical", "open-mpi-4.1"]),
        ({"links": {"inter": {"bandwidth_gbps": -1}}}, "links.inter.bandwidth_gbps", ["> 0"]),
        ({"links": {"inter": {"fits": {1: [0, 0]}}}}, "links.inter.fits.1", [">= 2"]),
        ({"layers": [[1, 2, 3]]}, "layers[0]", ["[grad_bytes, backward_s]"]),
        ({"model": "resnet50"}, "model", ["exactly one of model and layers"]),
    ],
)
def test_bad_input_names_the_key(change: dict[str, object], path: str, words: list[str]) -> None:
    with pytest.raises(SpecError) as info:
        forecast_spec.parse(yaml.safe_dump({**TWO_LAYERS, **change}))
    assert info.value.path == path
    for word in words:
        assert word in str(info.value)


def test_bad_input_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(yaml.safe_dump({**TWO_LAYERS, "exchange": {"algorithm": "star"}}))
    res = run_module("hpcbench", "predict", str(spec), "--csv", str(tmp_path / "out.csv"))
    assert res.returncode == 2
    assert res.stderr.startswith("hpcbench predict: error: exchange.algorithm: 'star' is not known")
    assert not (tmp_path / "out.csv").exists()


def test_a_measured_sweep_at_its_own_scales_and_beyond(tmp_path: Path) -> None:
    truth = {n: model_point(tmp_path, n)[1] for n in (1, 2, 4)}
    table = forecast.extrapolate(tmp_path, [1, 2])
    # the sweep's largest point has 4 ranks on one node, and its points follow the model exactly:
    # 1 node is that point; 2 nodes are 8 ranks, a ring over the same fitted link
    assert table["ranks"].tolist() == [4, 8]
    one, two = table["t_iter_s"].tolist()
    assert one == pytest.approx(truth[4], rel=1e-6)
    a, b = 2 * 7 * ALPHA, 2 * 7 / 8 * BETA  # ring of 8: tc(M) = a + b·M
    assert two > truth[4]
    assert two - truth[4] < a * 2 + b * 1.4e6 + 1e-9  # never more than the larger messages' growth
    assert table["batch_size"].iloc[0] == BATCH
    # no efficiency above 100 %; 2 nodes say they reuse the one node's link (no network measured)
    assert table["note"].tolist() == ["", forecast.ONE_NODE_NOTE]


def test_links_give_the_network_a_one_node_sweep_cannot_measure(tmp_path: Path) -> None:
    """`--links FILE.yaml`: 2 nodes or more are costed on its inter-node link. The sweep's own
    link given as the network predicts what it predicted without (the same ring over the same
    link), now without the note; a network 10 times slower lengthens 2 nodes, not 1."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    for n in (1, 2, 4):
        model_point(sweep, n)
    without = forecast.extrapolate(sweep, [1, 2])
    same = forecast.extrapolate(sweep, [1, 2], (LinkCost(ALPHA, BETA), "the truth"))
    assert same["t_iter_s"].tolist() == pytest.approx(without["t_iter_s"].tolist(), rel=1e-12)
    assert same["note"].tolist() == ["", ""] and same["comm_source"].iloc[1] == "the truth (the network, from --links)"
    slow = forecast.extrapolate(sweep, [1, 2], (LinkCost(ALPHA, 10 * BETA), "slow"))
    assert slow["t_iter_s"].iloc[0] == pytest.approx(without["t_iter_s"].iloc[0], rel=1e-12)
    assert slow["t_iter_s"].iloc[1] > same["t_iter_s"].iloc[1]
    links = tmp_path / "links.yaml"
    links.write_text(yaml.safe_dump({"links": {"inter": {"bandwidth_gbps": 10, "latency_us": 50}}}))
    res = run_module("hpcbench", "predict", str(sweep), "--nodes", "1,2", "--links", str(links))
    assert res.returncode == 0, res.stderr
    assert (
        "on 2 nodes or more: links.yaml: inter α 50.0 µs, β 10.0 Gbit/s per hop (the network, from --links)"
        in res.stdout
    )
    assert forecast.ONE_NODE_NOTE not in res.stdout
    res = run_module("hpcbench", "predict", str(sweep), "--nodes", "2")
    assert res.returncode == 0 and forecast.ONE_NODE_NOTE in res.stdout.splitlines()


@pytest.mark.parametrize(
    ("links", "words"),
    [
        ({"intra": {"bandwidth_gbps": 10}}, "links.inter: "),
        ({"inter": {"fits": {8: [1e-4, 1e-9]}}}, "links.inter: "),
        ({"inter": {"speed": 1}}, "links.inter.speed: unknown key"),
        (None, "--links: "),
    ],
)
def test_bad_links_exit_2_naming_the_key(tmp_path: Path, links: dict[str, object] | None, words: str) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    model_point(sweep, 2)
    path = tmp_path / "links.yaml"
    if links is not None:
        path.write_text(yaml.safe_dump(links))
    res = run_module("hpcbench", "predict", str(sweep), "--nodes", "2", "--links", str(path))
    assert res.returncode == 2 and res.stdout == "", res.stdout
    assert res.stderr.startswith(f"hpcbench predict: error: {words}"), res.stderr


def test_a_sweep_of_one_rank_only_is_refused_beyond_one_rank(tmp_path: Path) -> None:
    """One rank sends no message: no link can be fitted from it. Predicted without one, its
    own exchange phase (2.3 ms, which the model does not carry to more ranks) made 2 ranks
    110 % efficient; now the prediction is refused, in one line that says what is needed."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    model_point(sweep, 1, alone=0.0023)
    out = tmp_path / "out.csv"
    res = run_module("hpcbench", "predict", str(sweep), "--nodes", "2", "--csv", str(out))
    assert res.returncode == 2 and res.stdout == ""
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"hpcbench predict: error: {sweep}: torch/gloo mlp b={BATCH} was measured on 1 rank only")
    assert "needs points of >= 2 ranks" in line and "cannot be predicted at 2 ranks" in line
    assert "from_commbench" in line and not out.exists()
    # at its own single rank it is what was measured: 100 %, the exchange phase kept
    res = run_module("hpcbench", "predict", str(sweep), "--nodes", "1")
    assert res.returncode == 0, res.stderr
    assert "100.0%" in res.stdout and "efficiency above" not in res.stdout


def test_an_efficiency_above_100_percent_is_printed_with_why(tmp_path: Path) -> None:
    """The one-rank point's exchange phase (30 ms: its all-reduce over itself) is longer than
    the exchange the model exposes at 2 and 4 ranks over the link fitted on the 2-rank point:
    the efficiency exceeds 1, and every such row says why, with the numbers it comes from."""
    truth = {1: model_point(tmp_path, 1, alone=0.030)[1], 2: model_point(tmp_path, 2)[1]}
    assert truth[2] < truth[1]  # as measured: 2 ranks iterate faster than 1
    table = forecast.extrapolate(tmp_path, [1, 2])
    assert table["ranks"].tolist() == [2, 4] and (table["efficiency"] > 1).all()
    assert table["efficiency"].iloc[0] == pytest.approx(truth[1] / truth[2], rel=1e-6)
    for ranks, exposed, notes in zip(table["ranks"], table["exposed_comm_s"], table["note"].astype(str), strict=True):
        note = notes.splitlines()[-1]  # after the one node's link note, at 2 nodes
        assert note.startswith(f"efficiency above 100 % at {ranks} ranks: one rank's own exchange (30.00 ms")
        assert f"the model exposes {exposed * 1e3:.2f} ms of exchange (its messages over the fitted link)" in note
    res = run_module("hpcbench", "predict", str(tmp_path), "--nodes", "1,2")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    above = [note.splitlines()[-1] for note in table["note"]]
    assert [line for line in lines if line.startswith("efficiency above 100 %")] == above


def test_one_process_driving_several_devices(tmp_path: Path) -> None:
    """`devices_per_rank` and `host`: one process of 4 devices per node, its host work per device
    (2 ms) done in turn: 3 x 2 ms on top of the step; the CSV says devices and that time."""
    spec = tmp_path / "four.yaml"
    raw = {**TWO_LAYERS, "ranks_per_node": 1, "devices_per_rank": 4, "host": {"seconds": 0.002}, "nodes": [1]}
    spec.write_text(yaml.safe_dump(raw))
    out = tmp_path / "four.csv"
    res = run_module("hpcbench", "predict", str(spec), "--csv", str(out))
    assert res.returncode == 0, res.stderr
    assert "1 ranks per node driving 4 devices each (batch per device; host work 2.00 ms per device" in res.stdout
    (row,) = list(csv.DictReader(io.StringIO(out.read_text())))
    exposed = max(0.020 + ring(1e6, 4, 1e-5, 1e-10), 0.030) + ring(4e6, 4, 1e-5, 1e-10) - 0.030
    assert float(row["t_iter_s"]) == pytest.approx(0.050 + exposed + 3 * 0.002)
    assert (row["ranks"], row["devices"]) == ("1", "4")
    assert float(row["host_serial_s"]) == pytest.approx(0.006)
    assert float(row["throughput"]) == pytest.approx(4 * 32 / float(row["t_iter_s"]))
