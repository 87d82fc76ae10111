"""`hpcbench compare` on sweeps whose truth is known: point files written through the real writer
with step times drawn around set durations (iteration noise per rank, run-to-run noise per
repeat, fixed seeds). Identical truth: nothing significant, exit 0. One configuration 20 %
slower: exit 1, it is named, its interval excludes 1 and holds the true ratio. 2 % slower:
significant but within a 5 % threshold, exit 0. Bad input: exit 2 with a one-line message."""

from __future__ import annotations

import dataclasses
import io
import math
from html.parser import HTMLParser
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest

from hpcbench.analysis import compare as cmp
from hpcbench.cli import compare as cli
from hpcbench.spec import Point
from hpcbench.store import provenance as per_run
from hpcbench.store import schema
from hpcbench.testing.arrays import iterations
from hpcbench.testing.fabricate import write_point_file
from tests.conftest import run_module

BASE_S = {("lenet", 2): 0.050, ("lenet", 4): 0.060, ("mlp", 2): 0.020}  # every rank's step time, noise aside
SLOWED = ("lenet", 4)
REPEATS = (1, 2, 3)
TIMED, WARMUP = 60, 5
NOISE, QUIET = 0.05, 0.01  # iteration noise (relative standard deviation), in most sweeps and in quiet ones
OLD = {"torch": "2.1.0", "nccl": "2.18.1", "slurm_job_id": "1001"}
NEW = {"torch": "2.3.1", "nccl": "2.20.5", "slurm_job_id": "2002"}


def point_of(model: str, ranks: int, seed: int, env: str) -> Point:
    return Point(framework="torch", backend="gloo", model=model, ranks_per_node=ranks, batch_size=8, seed=seed, env=env)


def noisy(ranks: int, step_s: float, rng: np.random.Generator, noise: float, run_noise: float) -> np.ndarray:
    """Iteration records whose every rank takes step_s x (1 + run noise) x (1 + iteration noise);
    the warm-up iterations take 10x longer (they must be left out)."""
    a = iterations(ranks, WARMUP + TIMED, warmup=WARMUP, forward=step_s, batch=8)
    run = 1 + run_noise * rng.standard_normal()
    durations = step_s * run * (1 + noise * rng.standard_normal((ranks, WARMUP + TIMED)))
    durations[:, :WARMUP] *= 10
    a["t_end"] = a["t_start"] + durations
    return a


def write_sweep(
    directory: Path,
    slow: dict[tuple[str, int], float],
    seed: int,
    env: str,
    provenance: dict[str, str],
    *,
    noise: float = NOISE,
    run_noise: float = NOISE / 5,
    extra: tuple[str, int] | None = None,
) -> Path:
    """A sweep of BASE_S's configurations x REPEATS; `slow`: factors on the true step times;
    `extra`: one more configuration, in this sweep only."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    configs = {**BASE_S, **({extra: 0.030} if extra else {})}
    for (model, ranks), step_s in configs.items():
        for repeat in REPEATS:
            point = point_of(model, ranks, repeat, env)
            a = noisy(ranks, step_s * slow.get((model, ranks), 1.0), rng, noise, run_noise)
            write_point_file(directory / f"{point.id}.h5", point, a, provenance=provenance)
    return directory


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compare")
    return {
        "baseline": write_sweep(root / "baseline", {}, 11, "old", OLD, extra=("alexnet", 2)),
        "same": write_sweep(root / "same", {}, 12, "new", NEW, extra=("vgg11", 2)),
        "slower": write_sweep(root / "slower", {SLOWED: 1.2}, 13, "new", NEW),
        "quiet": write_sweep(root / "quiet", {}, 14, "old", OLD, noise=QUIET, run_noise=QUIET / 5),
        "quiet2pc": write_sweep(
            root / "quiet2pc", dict.fromkeys(BASE_S, 1.02), 15, "new", NEW, noise=QUIET, run_noise=QUIET / 5
        ),
    }


def run_cli(*args: str | Path) -> tuple[int, str]:
    out = io.StringIO()
    code = cli.main([str(a) for a in args], out)
    return code, out.getvalue()


def label(model: str, ranks: int) -> str:
    return point_of(model, ranks, 0, "x").label()


def test_identical_truth_gives_nothing_significant(sweeps: dict[str, Path]) -> None:
    c = cmp.compare(sweeps["baseline"], sweeps["same"])
    assert len(c.rows) == len(BASE_S)
    for row in c.rows:
        assert row.low <= 1 <= row.high, (row.point.label(), row.low, row.high)
        assert row.high - row.low < 0.1  # an interval that says something: a few % wide
        assert not row.significant and row.verdict == "no change"
        assert row.baseline_points and len(row.baseline_points) == len(REPEATS) == len(row.new_points)
    code, text = run_cli(sweeps["baseline"], sweeps["same"])
    assert code == 0
    assert "no regression" in text.splitlines()[-1]


def test_a_twenty_percent_slowdown_is_a_named_regression(sweeps: dict[str, Path]) -> None:
    c = cmp.compare(sweeps["baseline"], sweeps["slower"], metric="throughput")
    (bad,) = c.regressions
    assert (bad.point.model, bad.point.ranks_per_node) == SLOWED
    assert bad.high < 1, "the interval must exclude 1"
    assert bad.low <= 1 / 1.2 <= bad.high, f"true ratio {1 / 1.2:.4f} not in [{bad.low:.4f}, {bad.high:.4f}]"
    assert bad.ratio == pytest.approx(1 / 1.2, rel=0.03)
    assert bad.verdict == "REGRESSION"
    assert all(not row.significant for row in c.rows if row is not bad)
    code, text = run_cli(sweeps["baseline"], sweeps["slower"])
    assert code == 1
    last = text.splitlines()[-1]
    assert last.startswith("REGRESSED: 1 of 3") and label(*SLOWED) in last
    assert label("lenet", 2) not in last


def test_t_iter_is_lower_is_better(sweeps: dict[str, Path]) -> None:
    c = cmp.compare(sweeps["baseline"], sweeps["slower"], metric="t_iter")
    (bad,) = c.regressions
    assert (bad.point.model, bad.point.ranks_per_node) == SLOWED
    assert 1 < bad.low <= 1.2 <= bad.high
    # t_iter is the median of the ranks' mean step: the mean of r normals is normal about the
    # step, so its median is the step itself (the median of their maximum would sit at the
    # quantile 0.5 ** (1 / r) of one normal: 6 % longer here)
    ranks = SLOWED[1]
    assert bad.baseline == pytest.approx(BASE_S[SLOWED], rel=0.02)
    longest = BASE_S[SLOWED] * (1 + NOISE * NormalDist().inv_cdf(0.5 ** (1 / ranks)))
    assert bad.baseline != pytest.approx(longest, rel=0.02)
    assert run_cli(sweeps["baseline"], sweeps["slower"], "--metric", "t_iter")[0] == 1
    # the other way round it got faster: significant, no regression
    back = cmp.compare(sweeps["slower"], sweeps["baseline"], metric="t_iter")
    assert [r.verdict for r in back.rows if r.significant] == ["faster"]
    assert not back.regressions


def test_a_two_percent_slowdown_is_within_a_five_percent_threshold(sweeps: dict[str, Path]) -> None:
    c = cmp.compare(sweeps["quiet"], sweeps["quiet2pc"], threshold=5)
    for row in c.rows:
        assert row.low <= 1 / 1.02 <= row.high
        assert row.significantly_worse and row.verdict == "slower"  # real, but small
    assert not c.regressions
    assert run_cli(sweeps["quiet"], sweeps["quiet2pc"], "--threshold", "5")[0] == 0
    code, text = run_cli(sweeps["quiet"], sweeps["quiet2pc"], "--threshold", "1%")
    assert code == 1
    assert text.splitlines()[-1].startswith("REGRESSED: 3 of 3")


def test_unmatched_configurations_and_ignored_fields_are_listed(sweeps: dict[str, Path]) -> None:
    c = cmp.compare(sweeps["baseline"], sweeps["same"])
    assert [x.point.model for x in c.only_baseline] == ["alexnet"]
    assert [x.point.model for x in c.only_new] == ["vgg11"]
    code, text = run_cli(sweeps["baseline"], sweeps["same"])
    assert code == 0
    assert "only in baseline (1)" in text and label("alexnet", 2) in text
    assert "only in new (1)" in text and label("vgg11", 2) in text
    ignored_line = next(line for line in text.splitlines() if line.startswith("matched on every Point field but"))
    for name in cmp.IGNORED_FIELDS:
        assert f"{name} (" in ignored_line


def test_ignore_leaves_a_field_out_of_matching(tmp_path: Path) -> None:
    """The new sweep sets an environment variable: its configuration matches only once `environ`
    is ignored too; one run per sweep gets its note."""
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    rng = np.random.default_rng(5)
    plain = point_of("lenet", 2, 1, "old")
    tuned = dataclasses.replace(point_of("lenet", 2, 1, "new"), environ=(("NCCL_ALGO", "Ring"),))
    write_point_file(old / f"{plain.id}.h5", plain, noisy(2, 0.05, rng, NOISE, 0.0))
    write_point_file(new / f"{tuned.id}.h5", tuned, noisy(2, 0.05, rng, NOISE, 0.0))
    apart = cmp.compare(old, new)
    assert not apart.rows and len(apart.only_baseline) == len(apart.only_new) == 1
    code, _ = run_cli(old, new)
    assert code == 2
    together = cmp.compare(old, new, ignore=["environ"])
    (row,) = together.rows
    # the same truth: the ratio is 1 within 3 sigmas of the steps' noise (about 1 % here) and no
    # regression is drawn (its 95 % interval misses 1 for one draw in 20, this one among them:
    # "slower" by 2 %, under the 5 % threshold)
    assert row.ratio == pytest.approx(1, abs=0.03) and row.verdict != "REGRESSION"
    assert "environ" in together.ignored
    assert any("one run in a sweep" in note for note in together.notes)
    assert run_cli(old, new, "--ignore", "environ")[0] == 0


def test_provenance_differences_are_listed_without_job_ids(sweeps: dict[str, Path]) -> None:
    c = cmp.compare(sweeps["baseline"], sweeps["same"])
    diffs = {d.key: (d.baseline, d.new) for d in c.provenance}
    assert diffs == {"torch": (("2.1.0",), ("2.3.1",)), "nccl": (("2.18.1",), ("2.20.5",))}
    same = cmp.compare(sweeps["baseline"], sweeps["quiet"])  # the same provenance
    assert same.provenance == []


def open_mpi_run(job: int, pid: int, **settings: str) -> dict[str, object]:
    """The provenance one Open MPI run records, as real point files hold it: job ids, daemon
    URIs, session folders, a random key and the sampler's thread ids change on every run."""
    environment = {
        "OMPI_MCA_ess_base_jobid": str(job * 65536 + 1),
        "OMPI_MCA_ess_base_vpid": "0",
        "OMPI_MCA_orte_hnp_uri": f"{job * 65536}.0;tcp://192.0.2.2:{40000 + pid % 999};tcp6://[fd00::2]:59793",
        "OMPI_MCA_orte_local_daemon_uri": f"{job * 65536}.0;tcp://192.0.2.2:{40000 + pid % 999}",
        "OMPI_MCA_orte_jobfam_session_dir": f"/tmp/ompi.vm.0/pid.{pid}",
        "OMPI_MCA_orte_top_session_dir": "/tmp/ompi.vm.0",
        "OMPI_MCA_orte_precondition_transports": f"{pid:016x}-{job:016x}",
        "OMPI_MCA_orte_tmpdir_base": "/tmp",
        "OMPI_MCA_mpi_oversubscribe": "1",
        "SLURM_JOB_ID": str(job),
        "OMP_NUM_THREADS": "1",
        **settings,
    }
    sources = {"cpu": "/proc/stat, /proc/self/statm", "gpu": "absent: no GPU index given",
               "sched": f"process CPU clock; schedstat: /proc/self/task/*/schedstat, main thread "
                        f"/proc/self/task/{pid + 4}/schedstat"}  # fmt: skip
    second = {**sources, "sched": sources["sched"].replace(f"{pid + 4}", f"{pid + 5}")}
    return {"mpi": "Open MPI v4.1.4", "torch": "2.13.0+cpu", "slurm_job_id": str(job),
            "environment": environment, "resource_sources": [sources, second]}  # fmt: skip


def one_run(directory: Path, provenance: dict[str, object]) -> Path:
    directory.mkdir(parents=True)
    point = point_of("lenet", 2, 1, "old")
    a = noisy(2, 0.05, np.random.default_rng(1), NOISE, 0.0)
    write_point_file(directory / f"{point.id}.h5", point, a, provenance=provenance)
    return directory


def test_provenance_that_differs_on_every_run_is_left_out(tmp_path: Path) -> None:
    base = one_run(tmp_path / "a", open_mpi_run(820051969, 23583))
    again = one_run(tmp_path / "b", open_mpi_run(830537729, 23935))
    c = cmp.compare(base, again)
    assert c.provenance == [], [d.key for d in c.provenance]
    upgraded = open_mpi_run(840000001, 24000, OMPI_MCA_btl="self,tcp")
    upgraded["mpi"] = "Open MPI v4.1.6"
    changed = one_run(tmp_path / "c", upgraded)
    diffs = {d.key: (d.baseline, d.new) for d in cmp.compare(base, changed).provenance}
    assert diffs == {
        "mpi": (("Open MPI v4.1.4",), ("Open MPI v4.1.6",)),
        "environment.OMPI_MCA_btl": ((), ("self,tcp",)),
    }
    assert per_run.per_run_key("environment.OMPI_MCA_orte_hnp_uri") and not per_run.per_run_key("environment.NCCL_ALGO")
    masked = per_run.steady_value("main thread /proc/self/task/23587/schedstat")
    assert masked == "main thread /proc/PID/task/TID/schedstat"


def test_the_per_run_rule_is_in_the_docs() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "compare.md").read_text(encoding="utf-8")
    missing = [key for key in per_run.PER_RUN_KEYS if f"`{key}`" not in doc]
    missing += [mask for _, mask, _ in per_run.PER_RUN_VALUES if f"`{mask}`" not in doc]
    assert not missing, f"docs/compare.md#provenance does not list {missing}"


def test_the_output_is_reproducible(sweeps: dict[str, Path]) -> None:
    first = run_cli(sweeps["baseline"], sweeps["slower"], "--format", "csv")
    assert first == run_cli(sweeps["baseline"], sweeps["slower"], "--format", "csv")


def test_csv_md_and_html_parse(sweeps: dict[str, Path], tmp_path: Path) -> None:
    code, text = run_cli(sweeps["baseline"], sweeps["slower"], "--format", "csv")
    assert code == 1
    table = pd.read_csv(io.StringIO(text))
    assert list(table.columns[: len(cli.CSV_COLUMNS)]) == cli.CSV_COLUMNS
    assert sorted(table["status"]) == ["matched"] * 3 + ["only_baseline"]
    bad = table[table["regressed"] == True]  # noqa: E712 - a column of booleans
    assert list(bad["configuration"]) == [label(*SLOWED)]
    assert float(bad["ratio"].iloc[0]) == pytest.approx(1 / 1.2, rel=0.03)
    matched = table[table["status"] == "matched"]
    assert (matched["ci_low"] < matched["ci_high"]).all()
    assert table.loc[table["status"] == "only_baseline", "baseline"].notna().all()

    md_path = tmp_path / "c.md"
    code, said = run_cli(sweeps["baseline"], sweeps["slower"], "--format", "md", "-o", md_path)
    assert code == 1 and f"wrote {md_path}" in said and "REGRESSED" in said
    lines = md_path.read_text().splitlines()
    head = lines.index("| configuration | runs | baseline samples/s | new samples/s | new/base | 95 % interval | "
                       "change | verdict |")  # fmt: skip
    assert set(lines[head + 1].replace(" ", "")) == {"|", "-"} and lines[head + 1].count("|") == 9
    body = lines[head + 2 : head + 5]
    assert all(line.count("|") == 9 for line in body) and sum("REGRESSION" in line for line in body) == 1

    class Cells(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tables: list[list[list[str]]] = []
            self.cell: list[str] | None = None

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "table":
                self.tables.append([])
            elif tag == "tr":
                self.tables[-1].append([])
            elif tag in ("td", "th"):
                self.cell = []

        def handle_endtag(self, tag: str) -> None:
            if tag in ("td", "th") and self.cell is not None:
                self.tables[-1][-1].append("".join(self.cell))
                self.cell = None

        def handle_data(self, data: str) -> None:
            if self.cell is not None:
                self.cell.append(data)

    code, page = run_cli(sweeps["baseline"], sweeps["slower"], "--format", "html")
    assert code == 1 and page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    parser = Cells()
    parser.feed(page)
    configs, only_base, prov = parser.tables
    assert configs[0][0] == "configuration" and len(configs) == 4
    assert [row[-1] for row in configs[1:]].count("REGRESSION") == 1
    assert only_base[1][0] == label("alexnet", 2)
    assert {row[0] for row in prov[1:]} == {"torch", "nccl"}


def test_a_real_subprocess_exits_1_and_writes_the_file(sweeps: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "compare.txt"
    res = run_module("hpcbench", "compare", str(sweeps["baseline"]), str(sweeps["slower"]), "-o", str(out))
    assert res.returncode == 1, res.stderr
    assert label(*SLOWED) in res.stdout.splitlines()[-1]
    assert "REGRESSION" in out.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{missing}", "{base}"], "BASELINE_DIR: {missing}: no such directory"),
        (["{base}", "{missing}"], "NEW_DIR: {missing}: no such directory"),
        (["{empty}", "{base}"], "BASELINE_DIR: {empty}: no complete point files"),
        (["{base}", "{running}"], "NEW_DIR: {running}: no complete point files"),
        (
            ["{base}", "{base}", "--metric", "speed"],
            "--metric: unknown metric 'speed' (allowed: throughput, tokens_per_s, t_iter, "
            "energy_per_sample_j, energy_per_token_j)",
        ),
        (["{base}", "{base}", "--threshold", "-3"], "--threshold: -3 is not a percentage >= 0"),
        (["{base}", "{base}", "--threshold", "lots"], "--threshold: 'lots' is not a number"),
        (["{base}", "{base}", "--threshold", "nan"], "--threshold: nan is not a percentage >= 0"),
        (["{base}", "{base}", "--format", "pdf"], "--format: unknown format 'pdf' (allowed: text, md, html, csv)"),
        (["{base}", "{base}", "--ignore", "colour"], "--ignore: unknown Point fields ['colour']"),
        (["{base}", "{other}"], "no configuration is in both sweeps"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    args: list[str], message: str, sweeps: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty, running, other = tmp_path / "empty", tmp_path / "running", tmp_path / "other"
    empty.mkdir()
    running.mkdir()
    point = point_of("lenet", 2, 1, "new")
    write_point_file(running / f"{point.id}.h5", point, iterations(2, 10), status=schema.STATUS_RUNNING)
    _only(other)
    names = {"missing": tmp_path / "missing", "base": sweeps["baseline"], "empty": empty, "running": running,
             "other": other}  # fmt: skip
    code, _ = run_cli(*[a.format(**names) for a in args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("hpcbench compare: error: ")
    assert message.format(**names) in err[-1]


def _only(directory: Path) -> None:
    """A sweep with one configuration no other sweep has."""
    directory.mkdir()
    point = point_of("resnet18", 8, 1, "new")
    write_point_file(directory / f"{point.id}.h5", point, iterations(8, 20, warmup=2, forward=0.1))


def test_the_interval_covers_the_truth_about_95_percent_of_the_time() -> None:
    """Calibration on arrays (no files): 60 configurations whose truth is equal on both sides
    (ratio 1), with iteration and run-to-run noise; the intervals hold 1 in 80-100 % of them."""
    rng = np.random.default_rng(7)

    def runs() -> list[cmp.Run]:
        out = []
        for j in range(3):
            level = 0.05 * (1 + 0.01 * rng.standard_normal())
            steps = level * (1 + 0.05 * rng.standard_normal(60))
            out.append(cmp.Run(f"p{j}", steps, 4, 8))
        return out

    held = []
    for i in range(60):
        low, high = cmp.ratio_interval(runs(), runs(), cmp.METRICS["throughput"], f"{i:012x}", n_boot=1000)
        assert math.isfinite(low) and low < high
        held.append(low <= 1 <= high)
    assert 0.8 <= np.mean(held) <= 1.0, f"coverage {np.mean(held):.0%}"


@pytest.mark.parametrize(
    "steps", [[3.0], [2.0, 7.0], [1.0, 2.0, 3.0, 5.0], [1.0, 2.0, 4.0, 8.0, 16.0], [1, 1, 2, 9, 9, 9]]
)
def test_resampled_medians_follow_the_exact_resampling_distribution(steps: list[float]) -> None:
    """Against every one of the n^n equally likely resamples, enumerated: the frequency of each
    median among 200,000 drawn ones is within 0.01 of its exact probability (6 standard errors)."""
    n = len(steps)
    grid = np.stack(np.meshgrid(*[np.arange(n)] * n, indexing="ij"), axis=-1).reshape(-1, n)
    exact = pd.Series(np.median(np.asarray(steps, dtype=float)[grid], axis=1)).value_counts(normalize=True)
    drawn = cmp.resampled_medians(np.asarray(steps, dtype=float), 200_000, np.random.default_rng(1))
    seen = pd.Series(drawn).value_counts(normalize=True)
    assert set(seen.index) <= set(exact.index)
    gap = (seen.reindex(exact.index, fill_value=0.0) - exact).abs().max()
    assert gap < 0.01, f"largest gap {gap:.4f}"


def test_an_undefined_metric_is_no_verdict(tmp_path: Path) -> None:
    """Zero step times: throughput is undefined (NaN), so is the interval; never "no change"."""
    for name in ("old", "new"):
        (tmp_path / name).mkdir()
        point = point_of("lenet", 2, 1, name)
        write_point_file(tmp_path / name / f"{point.id}.h5", point, iterations(2, 12, warmup=2))
    c = cmp.compare(tmp_path / "old", tmp_path / "new")
    (row,) = c.rows
    assert math.isnan(row.ratio) and math.isnan(row.low)
    assert row.verdict == "undefined" and not row.significant and not row.regressed
    assert run_cli(tmp_path / "old", tmp_path / "new")[0] == 0
    assert cmp.compare(tmp_path / "old", tmp_path / "new", metric="t_iter").rows[0].verdict == "undefined"
