"""`python -m hpcbench.analyze report` on real sweeps (real mpirun ranks), opened in a real
headless Chromium (its figures drawn, a real mouse hover naming a point, no network asked);
the report's notes grouped by kind; and the analysis importing no framework and no MPI."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import pandas as pd
import pytest

from hpcbench.analysis import pipeline
from hpcbench.analysis import stats as stats_module
from hpcbench.analysis.report import html as report_html
from hpcbench.analysis.report import notes as report_notes
from hpcbench.spec import Point
from hpcbench.testing.arrays import iterations
from hpcbench.testing.fabricate import write_point_file
from tests.analysis.browser import PageResult, ensure_chromium, open_page
from tests.conftest import ROOT, run_module, skip_unless_required, spec_text

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

FIGURES = 13  # 9, the parallel layouts' 1, and the straggler section's 3 (heat map, cost per rank, slow hosts)
MAX_BYTES = 10_000_000  # the page, plotly.js included
# JavaScript run in the page: the figures drawn (a promise: figures are drawn one by one after
# load), and each drawn figure's SVG and marks (points, bars, heat-map cells)
DRAWN = "new Promise(r => { const t = () => (window.reportDrawn ? r(window.reportDrawn) : setTimeout(t, 50)); t(); })"
PLOTS = (
    "Array.from(document.querySelectorAll('div.plot')).map(g => ({id: g.id, "
    "svg: g.querySelectorAll('.main-svg').length, "
    "marks: g.querySelectorAll('.scatterlayer .point, .barlayer .point, .heatmaplayer image').length}))"
)
HOVERED = "#figure_throughput_vs_ranks .scatterlayer .point"  # the first point of the throughput figure
LEGEND = "#figure_throughput_vs_ranks .legend .traces .legendtoggle"  # its first legend entry
# after a click on it (plotly waits for a possible double click first): each line's visibility
VISIBLE = (
    "new Promise(r => setTimeout(() => r(document.getElementById('figure_throughput_vs_ranks').data"
    ".map(t => t.visible === undefined ? true : t.visible)), 1000))"
)


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
        skip_unless_required("chromium is not installed and apt-get cannot reach its repositories")
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
    """Figure title -> 'plot' or 'missing', in page order."""
    found = re.findall(r'<div class="figure" data-title="([^"]+)"><h3>[^<]+</h3>(<div id="|<p class="missing">)', html)
    return {title: ("plot" if kind.startswith("<div") else "missing") for title, kind in found}


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
    if stats["energy_per_sample_j"].isna().all():  # this machine: no RAPL, no GPU
        expected_missing.add("Energy per sample vs ranks")
    if pd.read_csv(reported / "layouts.csv").empty:  # no point runs a parallel layout
        expected_missing.add("Layouts: measured vs predicted")
    assert {t for t, k in sections.items() if k == "missing"} == expected_missing
    assert html.count('<div class="figure"') == FIGURES
    assert html.count('class="plot"') == FIGURES - len(expected_missing)
    assert "<img " not in html  # no pictures: the figures are drawn in the page


def test_each_figure_has_its_data_beside_it(reported: Path) -> None:
    html = (reported / "report.html").read_text()
    for title, kind in _figure_sections(html).items():
        name = f"figure_{re.sub(r'[^a-z0-9]+', '_', title.lower()).strip('_')}.csv"
        if kind == "plot":
            assert f'<a href="{name}">' in html
            assert len(pd.read_csv(reported / name)) > 0, name
        else:
            assert (reported / name).read_text() == "", name  # no data, no link
    throughput = pd.read_csv(reported / "figure_throughput_vs_ranks.csv")
    stats = pd.read_csv(reported / "stats.csv").set_index("ranks")
    assert sorted(throughput["ranks"]) == [1, 2]
    by_n = throughput.set_index("ranks")["throughput"]
    assert by_n.to_dict() == pytest.approx(stats["throughput"].to_dict(), rel=1e-9)  # the drawn numbers
    assert set(throughput["points"]) == set(stats["point"])
    assert {f.name for f in reported.glob("figure_*.csv")} == set(report_html.figure_files())


def test_the_page_is_one_file_under_10_mb_that_asks_for_nothing(reported: Path) -> None:
    page = reported / "report.html"
    html = page.read_text()
    assert page.stat().st_size < MAX_BYTES
    assert html.count("<script>") == 1  # plotly.js and the drawing code, once
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=\"(?!data:)", html)  # nothing loaded


def test_report_opens_in_chromium_with_every_figure_rendered(reported: Path, chromium: str) -> None:
    html = (reported / "report.html").read_text()
    drawn = html.count('class="plot"')
    stats = pd.read_csv(reported / "stats.csv")
    page = open_page(reported / "report.html", chromium, {"drawn": DRAWN, "plots": PLOTS}, hover=HOVERED,
                     click=LEGEND, after_click={"visible": VISIBLE})  # fmt: skip
    assert page.loaded
    assert page.title.startswith("hpcbench report")
    assert page.errors == []
    assert page.values["drawn"] > 0
    plots = page.values["plots"]
    assert len(plots) == drawn >= 8
    for plot in plots:
        assert plot["svg"] > 0, plot
        assert plot["marks"] > 0, plot  # data were drawn, not only axes
    # the mouse on the throughput figure's first point (N=1) shows its configuration and id
    one = stats[stats["ranks"] == 1].iloc[0]
    assert f"{one['framework']}/{one['backend']} {one['model']} b={one['batch_size']}" in page.hover
    assert f"point {one['point']}" in page.hover
    # a click on the first legend entry hides that line, and only it (the page's own state)
    assert page.values["visible"][0] == "legendonly"
    assert all(v is True for v in page.values["visible"][1:])
    # offline: the page asked for nothing but itself and data: URLs (Chromium's proxy leads nowhere)
    assert page.requests[0] == (reported / "report.html").resolve().as_uri()
    assert all(url.startswith(("file:", "data:")) for url in page.requests), page.requests


def test_the_notes_are_grouped_by_kind() -> None:
    """Real notes (analysis/stats.py) of four points, two kinds: one line per kind naming its
    points, each point's note in the table under it."""
    table = pd.DataFrame(
        {"point": ["p1", "p2", "p3", "p4"], "timed_iterations": [5, 5, 100, 100], "cv": [0.5, 0.01, 0.3, 0.01]}
    )
    said = stats_module.point_warnings(table)
    assert len(said) == 4  # 2 too short, 2 unstable
    kinds = report_notes.grouped(said)
    assert [[subject for subject, _ in kind.notes] for kind in kinds] == [["p1", "p2"], ["p1", "p3"]]
    assert "only 5 timed iterations" in kinds[0].summary()  # a number all share is kept
    assert "vary by …% (CV)" in kinds[1].summary()  # one that differs is not
    page = "\n".join(report_notes.render([*said, "energy: not measured"]))
    assert page.count('<li class="note"') == 3
    assert page.count("<tr><td>") == 4  # each note, in its kind's table
    assert "2 points (p1, p2): only 5 timed iterations" in page


def test_the_browser_check_sees_broken_images_errors_and_requests(tmp_path: Path, chromium: str) -> None:
    page_path = tmp_path / "broken.html"
    page_path.write_text(
        '<!DOCTYPE html><html><head><link rel="icon" href="data:,"><title>t</title></head><body>'
        '<img alt="bad" src="data:image/png;base64,AAAA"><script>console.error("boom")</script>'
        '<script src="http://example.invalid/lib.js"></script><p id="x">plain</p></body></html>'
    )
    page: PageResult = open_page(page_path, chromium, {"text": "document.getElementById('x').textContent"}, "#x")
    assert page.loaded
    assert page.images[0]["naturalWidth"] == 0
    assert any("boom" in e for e in page.errors)
    assert "http://example.invalid/lib.js" in page.requests  # asked for, and failed: no network
    assert page.values["text"] == "plain"
    assert page.hover == ""  # no plotly figure: no hover text


STACKS = [("torch", "gloo"), ("torch", "mpi"), ("tensorflow", "ps"), ("mxnet", "dist_sync"), ("jax", "pmean"),
          ("chainer", "naive"), ("caffe", "mpi"), ("cntk", "mpi")]  # fmt: skip


def test_many_lines_are_split_into_panels_and_no_legend_lies_over_a_plot(tmp_path: Path) -> None:
    """8 configurations of one model (as analysis/frameworks.yaml's) at 1 and 2 ranks: more
    lines than one plot holds, so a panel per framework; every legend outside the plot area."""
    for k, (framework, backend) in enumerate(STACKS):
        for n in (1, 2):
            point = Point(framework=framework, backend=backend, ranks_per_node=n, batch_size=8)
            write_point_file(tmp_path / f"{point.id}.h5", point, iterations(n, 12, forward=0.01 * (k + 1), batch=8))
    analysis = pipeline.analyse(tmp_path)
    drawn = dict(report_html.draw(analysis))
    throughput = drawn["Throughput vs ranks"]
    assert throughput is not None
    layout = throughput.figure.layout
    titles = sorted(a.text for a in layout.annotations)
    assert titles == sorted({f for f, _ in STACKS})  # a panel per framework
    assert len(throughput.figure.data) == len(STACKS)  # a line per configuration
    assert {t.legendgroup for t in throughput.figure.data} == {f"{f}/{b}" for f, b in STACKS}  # toggled by it
    for title, plot in drawn.items():
        if plot is None:
            continue
        legend = plot.figure.layout.legend
        assert legend.x >= 1.0 or legend.y >= 1.0, title  # beside or above the plot area (paper coordinates)
        for trace in plot.figure.data:
            if trace.hoverinfo != "skip":  # every mark's hover names its configuration and point(s)
                assert trace.customdata is not None, (title, trace.name)
                assert {"%{customdata[0]}", "%{customdata[1]}"} <= set(
                    re.findall(r"%\{customdata\[\d\]\}", trace.hovertemplate)
                )


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
    assert sections["Load-imbalance factor"] == "plot"


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


def test_the_embedded_plotly_js_is_the_one_plotly_writes_figures_for() -> None:
    from plotly.offline import get_plotlyjs_version  # type: ignore[import-untyped]

    from hpcbench.analysis.report import plot

    assert plot.plotly_js_version() == get_plotlyjs_version()
    assert "Plotly" in plot.plotly_js()[:2_000_000] and plot.PLOTLY_JS.stat().st_size < 2_000_000
