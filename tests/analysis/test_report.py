"""`python -m hpcbench.analyze report` on real sweeps (real mpirun ranks), opened in a real
headless Chromium; and the analysis importing no framework and no MPI."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import pandas as pd
import pytest

from tests.analysis.browser import PageResult, ensure_chromium, open_page
from tests.conftest import ROOT, run_module, spec_text

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

FIGURES = 11  # 8, and the straggler section's 3 (heat map, cost per rank, slow hosts)


@pytest.fixture(scope="module")
def torch_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real PyTorch DDP sweep over gloo: 1 and 2 ranks, with messages, samples and evaluations."""
    base = tmp_path_factory.mktemp("torch")
    spec = base / "spec.yaml"
    spec.write_text(spec_text("rep", {"ranks_per_node": [1, 2]}, iterations=8, warmup=2, batch_size=16))
    res = run_module("hpcbench.sweep", str(spec), "--out", str(base / "sweep"))
    assert res.returncode == 0, res.stdout + res.stderr
    return base / "sweep"


@pytest.fixture(scope="module")
def reported(torch_sweep: Path) -> Path:
    res = run_module("hpcbench.analyze", "report", str(torch_sweep), "--target-accuracy", "0.05")
    assert res.returncode == 0, res.stderr
    assert f"wrote {torch_sweep / 'report.html'} (2 points)" in res.stdout
    return torch_sweep


@pytest.fixture(scope="module")
def chromium() -> str:
    binary = ensure_chromium()
    if binary is None:
        pytest.skip("chromium is not installed and apt-get cannot reach its repositories")
    return binary


def test_report_files_and_tables(reported: Path) -> None:
    for name in ("report.html", "report.md", "points.csv", "stats.csv", "repeats.csv", "predictions.csv",
                 "evaluations.csv"):  # fmt: skip
        assert (reported / name).stat().st_size > 0, name
    stats = pd.read_csv(reported / "stats.csv")
    assert sorted(stats["ranks"]) == [1, 2]
    assert (stats["throughput"] > 0).all()
    two = stats[stats["ranks"] == 2].iloc[0]
    assert two["scaling"] == "weak"
    assert two["comm_total_s"] > 0  # DDP's gradient messages were recorded
    preds = pd.read_csv(reported / "predictions.csv")
    assert len(preds) == 2  # every measured point has a prediction beside it
    assert preds["predicted_t_iter_s"].gt(0).all()
    assert preds["rel_error"].notna().all()
    error = (preds["predicted_t_iter_s"] - preds["measured_t_iter_s"]) / preds["measured_t_iter_s"]
    assert preds["rel_error"].to_numpy() == pytest.approx(error.to_numpy(), rel=1e-9)
    md = (reported / "report.md").read_text()
    for title in ("## Scaling", "## Phases", "## Performance model: predicted beside measured",
                  "## Training time, testing time, accuracy, CPU and memory"):  # fmt: skip
        assert title in md
    assert "| Training Time (s) | Testing Time (s) | Accuracy (%) | CPU user % | CPU system % | CPU iowait %" in md


def _figure_sections(html: str) -> dict[str, str]:
    """Figure title -> 'img' or 'missing', in page order."""
    found = re.findall(r'<h3>([^<]+)</h3>\n(<img alt=|<p class="missing">)', html)
    return {title: ("img" if kind.startswith("<img") else "missing") for title, kind in found}


def test_every_figure_is_drawn_or_said_to_be_missing(reported: Path) -> None:
    html = (reported / "report.html").read_text()
    sections = _figure_sections(html)
    assert len(sections) == FIGURES
    stats = pd.read_csv(reported / "stats.csv")
    evals = pd.read_csv(reported / "evaluations.csv")
    expected_missing = set()
    if stats["cpu_user"].isna().all() and stats["mem_avg_mib"].isna().all():
        expected_missing.add("Resource use")
    if evals.empty:
        expected_missing.add("Accuracy vs training time")
    assert {t for t, k in sections.items() if k == "missing"} == expected_missing
    assert html.count("<img ") == FIGURES - len(expected_missing)
    assert "http://" not in html and "https://" not in html  # self-contained


def test_report_opens_in_chromium_with_every_figure_rendered(reported: Path, chromium: str) -> None:
    html = (reported / "report.html").read_text()
    page = open_page(reported / "report.html", chromium)
    assert page.loaded
    assert page.title.startswith("hpcbench report")
    assert len(page.images) == html.count("<img ") >= 6
    for image in page.images:
        assert image["complete"], image
        assert image["naturalWidth"] > 0 and image["naturalHeight"] > 0, image
    assert page.errors == []


def test_the_browser_check_sees_broken_images_and_console_errors(tmp_path: Path, chromium: str) -> None:
    page_path = tmp_path / "broken.html"
    page_path.write_text(
        '<!DOCTYPE html><html><head><link rel="icon" href="data:,"><title>t</title></head><body>'
        '<img alt="bad" src="data:image/png;base64,AAAA"><script>console.error("boom")</script></body></html>'
    )
    page: PageResult = open_page(page_path, chromium)
    assert page.loaded
    assert page.images[0]["naturalWidth"] == 0
    assert any("boom" in e for e in page.errors)


def test_analysis_and_report_import_no_framework_and_no_mpi(torch_sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "copy"
    out.mkdir()
    for h5 in torch_sweep.glob("*.h5"):
        (out / h5.name).write_bytes(h5.read_bytes())
    code = (
        "import sys, runpy\n"
        "sys.argv = ['hpcbench.analyze', 'report', sys.argv[1]]\n"
        "try:\n"
        "    runpy.run_module('hpcbench.analyze', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "import hpcbench.analysis.tables, hpcbench.analysis.report.html, hpcbench.analysis.model.predict\n"
        "heavy = ('torch', 'mpi4py', 'mpi4py.MPI', 'tensorflow', 'mxnet', 'horovod')\n"
        "print('LOADED', [m for m in heavy if m in sys.modules])\n"
    )
    res = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, cwd=ROOT,
                         timeout=240)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "LOADED []" in res.stdout
    assert (out / "report.html").exists()


def test_report_of_a_synthetic_sweep_with_known_imbalance(tmp_path: Path) -> None:
    """Known durations through real ranks: rank 1 computes 1.5x as long as rank 0, so LIF = 1.5 / 1.25."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        spec_text("syn", {"ranks_per_node": [1, 2]}, framework="synthetic", backend="none", model="sleep",
                  iterations=10, warmup=1, extra={"forward_s": 0.02, "backward_s": 0.03, "rank_scale": 0.5})
    )  # fmt: skip
    assert run_module("hpcbench.sweep", str(spec), "--out", str(tmp_path / "s")).returncode == 0
    res = run_module("hpcbench.analyze", "report", str(tmp_path / "s"))
    assert res.returncode == 0, res.stderr
    stats = pd.read_csv(tmp_path / "s" / "stats.csv").set_index("ranks")
    rows: dict[Any, dict[Any, Any]] = stats.to_dict("index")
    assert stats.loc[1, "lif"] == pytest.approx(1.0)
    assert stats.loc[2, "lif"] == pytest.approx(1.5 / 1.25, rel=0.05)
    assert rows[2]["lif_excess"] == pytest.approx(rows[2]["lif"] - 1)
    assert rows[1]["forward_s"] >= 0.02 and rows[1]["backward_s"] >= 0.03
    html = (tmp_path / "s" / "report.html").read_text()
    sections = _figure_sections(html)
    assert sections["Accuracy vs training time"] == "missing"  # the synthetic workload does not evaluate
    assert sections["Load-imbalance factor"] == "img"


def test_report_errors_are_one_line(tmp_path: Path) -> None:
    res = run_module("hpcbench.analyze", "report", str(tmp_path / "none"))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [f"hpcbench.analyze: error: {tmp_path / 'none'}: no such sweep directory"]
    res = run_module("hpcbench.analyze", "report", str(tmp_path), "--target-accuracy", "97")
    assert res.returncode == 2
    assert "not a fraction in (0, 1]" in res.stderr
    bogus = tmp_path / "bench.h5"
    bogus.write_text("not hdf5")
    res = run_module("hpcbench.analyze", "report", str(tmp_path), "--commbench", str(bogus))
    assert res.returncode == 2
    # what h5py itself says of the file, asked apart from hpcbench
    with pytest.raises(OSError, match="file signature not found") as h5py_says:
        h5py.File(bogus, "r")
    assert res.stderr.strip().splitlines() == [
        f"hpcbench.analyze: error: {bogus}: not a readable HDF5 file ({h5py_says.value})"
    ]
