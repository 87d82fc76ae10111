"""`hpcbench predict FILE.yaml --layouts` on a YAML written here: every layout of the node
counts, those that fit first, fastest first, the rest marked out of memory; bad input exits 2
with one line naming the key (pure computation, in this process)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpcbench.analysis.model import forecast_spec
from hpcbench.analysis.model.layouts import transformer
from hpcbench.cli import predict

SPEC: dict[str, Any] = {
    "model": "gpt2_124m",
    "seq_len": 1024,
    "batch_size": 8,
    "precision": "bf16",
    "optimizer": "adamw",
    "device_memory_gb": 8,
    "peak_tflops": 100,
    "efficiency": 0.5,
    "ranks_per_node": 4,
    "nodes": [1, 2],
    "links": {"intra": {"bandwidth_gbps": 800, "latency_us": 3}, "inter": {"bandwidth_gbps": 100, "latency_us": 10}},
}


def _run(tmp_path: Path, spec: dict[str, Any], *extra: str) -> tuple[int, str]:
    path = tmp_path / "layouts.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    out = io.StringIO()
    code = predict.main([str(path), *extra], out=out)
    return code, out.getvalue()


def _tables(text: str) -> dict[int, list[list[str]]]:
    """Each node count's rows: [layout, t_iter, tokens/s, memory, exposed, bubble, note]."""
    found: dict[int, list[list[str]]] = {}
    current: list[list[str]] | None = None
    for line in text.splitlines():
        if " node(s) x " in line:
            current = found.setdefault(int(line.split()[0]), [])
        elif line.startswith("wrote "):
            current = None
        elif current is not None and line.strip() and not line.strip().startswith("layout"):
            cells = line.split("  ")
            cells = [c.strip() for c in cells if c.strip()]
            current.append(cells)
    return found


def test_every_layout_ranked_those_that_fit_first(tmp_path: Path) -> None:
    code, text = _run(tmp_path, SPEC, "--layouts", "--csv", str(tmp_path / "layouts.csv"))
    assert code == 0, text
    assert "gpt2_124m, 124,439,808 parameters, seq 1024, batch 8" in text
    assert "compute at 50% of the peak_tflops (100 TFLOP/s)" in text
    tables = _tables(text)
    assert set(tables) == {1, 2}
    for rows in tables.values():
        marks = ["out of memory" in row[-1] for row in rows]
        assert any(marks) and not all(marks) and marks == sorted(marks)  # the ones that do not fit after
        fitting = [float(row[2].replace(",", "")) for row in rows if "out of memory" not in row[-1]]
        assert fitting == sorted(fitting, reverse=True)  # the most tokens/s first
        assert all(float(row[3]) > 8 for row in rows if "out of memory" in row[-1])
    records = list(csv.DictReader((tmp_path / "layouts.csv").open(encoding="utf-8")))
    assert {"layout", "t_iter_s", "tokens_per_s", "memory_gib", "fits"} <= set(records[0])
    assert {int(r["ranks"]) for r in records} == {4, 8}
    assert all(int(r["dp"]) * int(r["fsdp"]) * int(r["tp"]) * int(r["pp"]) == int(r["ranks"]) for r in records)


def test_a_measured_rank_and_chosen_layouts(tmp_path: Path) -> None:
    spec = {**SPEC, "single_rank": {"throughput": 40.0}, "layouts": {"only": [{"tp": 2}, {"pp": 2, "fsdp": 2}]}}
    del spec["peak_tflops"]
    code, text = _run(tmp_path, spec, "--layouts")
    assert code == 0, text
    assert "compute measured on one rank (200.00 ms per batch)" in text
    tables = _tables(text)
    assert sorted(row[0] for row in tables[1]) == ["dp2 tp2", "pp2 fsdp2 mb8 1f1b"]
    assert sorted(row[0] for row in tables[2]) == ["dp4 tp2", "pp2 dp2 fsdp2 mb8 1f1b"]


def test_the_same_file_without_layouts_predicts_plain_scaling(tmp_path: Path) -> None:
    code, text = _run(tmp_path, SPEC)  # single_rank left out: the model's FLOPs at the peak
    assert code == 0, text
    assert "samples/s" in text and "no overlap" in text
    spec = forecast_spec.parse(yaml.safe_dump(SPEC))
    step = transformer("gpt2_124m").flops_per_sample * 8 / 50e12  # FLOPs of a batch at half of 100 TFLOP/s
    assert spec.phases.forward == pytest.approx(step / 3)
    assert sum(layer.backward_s for layer in spec.layers) == pytest.approx(step * 2 / 3)
    assert spec.single_rank_s is None and spec.peak_flops == 100e12


BAD = [
    ({"precision": "fp8"}, "precision: 'fp8' is not one of them"),
    ({"optimizer": "lamb"}, "optimizer: 'lamb'"),
    ({"device_memory_gb": -1}, "device_memory_gb: -1"),
    ({"efficiency": 1.5}, "efficiency: 1.5 is more than the whole peak"),
    ({"seq_len": 4096}, "seq_len: model gpt2_124m on input (4096,)"),
    ({"peak_tflops": None, "device": "NVIDIA Nothing"}, "device: 'NVIDIA Nothing' is not a device of the peaks table"),
    ({"peak_tflops": None, "device": "NVIDIA V100 SXM2"}, "device: NVIDIA V100 SXM2 has no bf16 peak"),
    ({"model": "resnet50", "seq_len": None}, "model: model 'resnet50' has no transformer blocks"),
    ({"device_memory_gb": None}, "device_memory_gb: is missing"),
    ({"peak_tflops": None}, "single_rank: is missing"),
    ({"layouts": {"only": [{"tp": 5}]}}, "layouts.only[0]: tp 5 does not divide the 12 heads"),
    ({"layouts": {"only": [{"tp": 2, "dp": 2}]}}, "layouts.only[0].dp: is filled"),
    ({"layouts": {"microbatches": 3}}, "layouts.microbatches: 3 does not divide batch_size 8"),
    ({"layouts": {"schedules": ["zb"]}}, "layouts.schedules[0]: 'zb'"),
    ({"links": {**SPEC["links"], "inter": {"fits": {8: [1e-5, 1e-9]}}}}, "links.inter: is given as per-P fits"),
]


@pytest.mark.parametrize(("change", "message"), BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_input_names_the_key(change: dict[str, Any], message: str, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    spec = {k: v for k, v in {**SPEC, **change}.items() if v is not None}
    code, _ = _run(tmp_path, spec, "--layouts")
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and len(err.strip().splitlines()) == 1


def test_layouts_goes_with_a_prediction_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    assert predict.main([str(tmp_path), "--layouts"], out=out) == 2
    assert "--layouts: " in capsys.readouterr().err
