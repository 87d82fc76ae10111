"""Two sweeps of the same configurations, before and after an upgrade: which configurations got
slower, by how much, and whether the change is real (docs/compare.md). No printing here:
hpcbench/cli/compare.py renders a `Comparison`.

- Matching: configurations are matched on every Point field but those that differ by design
  (`IGNORED_FIELDS`, plus any the caller names). Within one sweep, the points of one
  configuration are its repeats (usually they differ only in `seed`).
- The value of a configuration is the mean over its repeats of the per-point metric (t_iter:
  median over timed iterations of the ranks' mean step time; throughput: ranks x batch / t_iter).
- The 95 % interval of the ratio new / baseline is a hierarchical percentile bootstrap: in each
  of `N_BOOT` replicates, each sweep's repeats are drawn with replacement, and each drawn
  repeat's timed step times are drawn with replacement; the replicate's ratio is the ratio of
  the two recomputed values. The generator is seeded with (`SEED`, configuration key), so the
  output is the same on every run and does not depend on what else is compared.
- Verdicts: significant when the interval excludes 1; a regression when significantly worse
  (in the metric's direction) and the ratio is worse than `threshold` percent.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hpcbench.analysis import energy, metrics, tables
from hpcbench.analysis.stats import MIN_TIMED
from hpcbench.errors import SpecError
from hpcbench.spec import DEFAULTS, FIELD_NAMES, Point
from hpcbench.spec import labels as spec_labels
from hpcbench.store.provenance import steady_values
from hpcbench.store.reader import PointData

# Point fields left out of matching, and why.
IGNORED_FIELDS: dict[str, str] = {
    "env": "the named environment: what an upgrade changes",
    "seed": "repeats of a configuration are pooled",
    "data_dir": "where the dataset lies, not what it is",
    "slurm": "queueing options: account, partition, time limit; the hosts show in the provenance",
}
N_BOOT = 2000  # bootstrap replicates
SEED = 20160  # the bootstrap's fixed seed (with each configuration's key)
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    higher_is_better: bool

    def of(self, t_iter: Any, ranks: int, batch_size: int, tokens: int = 0, watts: float = math.nan) -> Any:
        """The metric from t_iter (seconds; a float or an array of them); `tokens` per sample
        (a sequence model's; 0: tokens/s is undefined, NaN); `watts` the point's power over its
        timed window (NaN: not measured): energy per sample = watts * t_iter / samples an iteration."""
        if self.name == "t_iter":
            return t_iter
        per_sample = 1 if self.name in ("throughput", "energy_per_sample_j") else (tokens or np.nan)
        samples = ranks * batch_size * per_sample
        t = np.asarray(t_iter)
        if self.name.startswith("energy_"):
            return watts * t / samples
        with np.errstate(divide="ignore"):
            return np.where(t > 0, samples / t, np.nan)


METRICS = {
    "throughput": Metric("throughput", "samples/s", higher_is_better=True),
    "tokens_per_s": Metric("tokens_per_s", "tokens/s", higher_is_better=True),
    "t_iter": Metric("t_iter", "s", higher_is_better=False),
    # the power over the timed window times the resampled step: the interval is time's (the
    # counters are read between steps, not per step, so power has no spread of its own here)
    "energy_per_sample_j": Metric("energy_per_sample_j", "J/sample", higher_is_better=False),
    "energy_per_token_j": Metric("energy_per_token_j", "J/token", higher_is_better=False),
}


def metric_named(name: str) -> Metric:
    if name not in METRICS:
        raise SpecError("--metric", f"unknown metric {name!r}", ", ".join(METRICS))
    return METRICS[name]


@dataclass(frozen=True)
class Run:
    """One repeat of a configuration: its timed step times (the ranks' mean, per iteration)."""

    point_id: str
    steps: np.ndarray
    ranks: int
    batch_size: int
    tokens: int = 0  # per sample (provenance `tokens_per_sample`)
    watts: float = math.nan  # power over the timed window (analysis/energy.py `watts`)

    def value(self, metric: Metric) -> float:
        return float(metric.of(float(np.median(self.steps)), self.ranks, self.batch_size, self.tokens, self.watts))


@dataclass
class Configuration:
    key: str  # the id of `point`
    point: Point  # a repeat's Point with the ignored fields reset to their defaults
    runs: list[Run] = field(default_factory=list)
    pooled: dict[str, set[str]] = field(default_factory=dict)  # ignored fields (not seed) -> values seen

    def value(self, metric: Metric) -> float:
        return float(np.mean([run.value(metric) for run in self.runs]))


@dataclass(frozen=True)
class Row:
    """A configuration found in both sweeps."""

    key: str
    point: Point
    baseline: float
    new: float
    ratio: float  # new / baseline
    low: float  # the ratio's 95 % interval
    high: float
    baseline_points: tuple[str, ...]
    new_points: tuple[str, ...]
    higher_is_better: bool
    threshold: float  # percent

    @property
    def loss(self) -> float:
        """How much worse the new value is, as a fraction (negative: better)."""
        return 1.0 - self.ratio if self.higher_is_better else self.ratio - 1.0

    @property
    def significant(self) -> bool:
        return bool(self.low > 1.0 or self.high < 1.0)

    @property
    def significantly_worse(self) -> bool:
        return bool(self.high < 1.0) if self.higher_is_better else bool(self.low > 1.0)

    @property
    def regressed(self) -> bool:
        return self.significantly_worse and self.loss * 100 > self.threshold

    @property
    def verdict(self) -> str:
        if not self.low <= self.high:  # NaN: no interval (a metric undefined, e.g. zero step times)
            return "undefined"
        if self.regressed:
            return "REGRESSION"
        if self.significantly_worse:
            return "slower"
        return "faster" if self.significant else "no change"


@dataclass(frozen=True)
class ProvenanceDiff:
    key: str
    baseline: tuple[str, ...]  # the values seen across the sweep's points (empty: not recorded)
    new: tuple[str, ...]


@dataclass
class Comparison:
    baseline_dir: Path
    new_dir: Path
    metric: Metric
    threshold: float  # percent
    ignored: dict[str, str]  # field -> why
    rows: list[Row]
    only_baseline: list[Configuration]
    only_new: list[Configuration]
    labels: dict[str, str]  # configuration key -> a short label
    provenance: list[ProvenanceDiff]
    warnings: list[str]  # point files skipped
    notes: list[str]  # what to keep in mind reading the numbers

    @property
    def regressions(self) -> list[Row]:
        return [row for row in self.rows if row.regressed]


THRESHOLD_ALLOWED = "a percentage >= 0, e.g. 5"


def threshold_percent(value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise SpecError("--threshold", f"{value:g} is not a percentage >= 0", THRESHOLD_ALLOWED)
    return value


def ignored_fields(extra: Sequence[str] = ()) -> dict[str, str]:
    """IGNORED_FIELDS plus the fields named in `extra` (checked)."""
    unknown = sorted(set(extra) - FIELD_NAMES)
    if unknown:
        raise SpecError("--ignore", f"unknown Point fields {unknown}", ", ".join(sorted(FIELD_NAMES)))
    out = dict(IGNORED_FIELDS)
    out.update({name: "asked for (--ignore)" for name in extra if name not in out})
    return out


def _load(argument: str, directory: Path) -> tables.SweepData:
    allowed = "a sweep directory holding complete <point>.h5 files"
    if not directory.is_dir():
        raise SpecError(argument, f"{directory}: no such directory", allowed)
    sweep = tables.load(directory)
    if not sweep.points:
        raise SpecError(argument, f"{directory}: no complete point files", allowed)
    return sweep


def configurations(points: Sequence[PointData], ignored: Sequence[str]) -> tuple[dict[str, Configuration], list[str]]:
    """A sweep's points grouped by configuration (key: the Point's id with `ignored` reset),
    and notes on the points left out (no timed iteration)."""
    found: dict[str, Configuration] = {}
    notes = []
    for p in points:
        steps = metrics.step_times(p.iterations)
        if steps.size == 0:
            notes.append(f"point {p.point_id}: no timed iteration; left out")
            continue
        reset = dataclasses.replace(p.point, **{name: getattr(DEFAULTS, name) for name in ignored})
        config = found.setdefault(reset.id, Configuration(reset.id, reset))
        tokens = int(p.provenance.get("tokens_per_sample") or 0)
        ranks = metrics.data_ranks(p.point, int(p.iterations.shape[0]))  # a batch each
        config.runs.append(Run(p.point_id, steps, ranks, p.point.batch_size, tokens, energy.watts(p)))
        for name in ignored:
            if name != "seed":
                config.pooled.setdefault(name, set()).add(json.dumps(getattr(p.point, name)))
    return found, notes


def resampled_medians(steps: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """Medians (as np.median takes them) of `count` resamples of `steps`, each n draws with
    replacement, without drawing the n values: a resample is the sorted steps at indices
    floor(n U_i), U_i uniform on [0, 1), and as floor keeps order its k-th smallest value is the
    step at floor(n U_(k)). The k-th of n uniforms U_(k) is Beta(k, n - k + 1), and U_(k+1) given
    U_(k) = u is u + (1 - u) Beta(1, n - k). So each median costs O(1), not O(n)."""
    ordered = np.sort(steps)
    n = ordered.size
    k = (n + 1) // 2  # the lower middle (1-based); for odd n the only one
    u = rng.beta(k, n - k + 1, size=count)
    lower = ordered[np.minimum((u * n).astype(np.intp), n - 1)]
    if n % 2:
        return np.asarray(lower)
    v = u + (1 - u) * rng.beta(1, n - k, size=count)
    return np.asarray((lower + ordered[np.minimum((v * n).astype(np.intp), n - 1)]) / 2)


def replicates(runs: Sequence[Run], metric: Metric, rng: np.random.Generator, n_boot: int = N_BOOT) -> np.ndarray:
    """`n_boot` bootstrap values of a configuration: repeats drawn with replacement, then each
    drawn repeat's timed iterations drawn with replacement; the mean of their metrics."""
    k = len(runs)
    draws = rng.integers(0, k, size=n_boot * k)
    values = np.empty(n_boot * k)
    for j, run in enumerate(runs):
        slots = np.flatnonzero(draws == j)
        medians = resampled_medians(run.steps, slots.size, rng)
        values[slots] = metric.of(medians, run.ranks, run.batch_size, run.tokens, run.watts)
    return np.asarray(values.reshape(n_boot, k).mean(axis=1))


def ratio_interval(
    baseline: Sequence[Run], new: Sequence[Run], metric: Metric, key: str, n_boot: int = N_BOOT, seed: int = SEED
) -> tuple[float, float]:
    """The 95 % percentile-bootstrap interval of new / baseline (seeded by `seed` and `key`)."""
    rng = np.random.default_rng([seed, int(key, 16)])
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = replicates(new, metric, rng, n_boot) / replicates(baseline, metric, rng, n_boot)
    ratios = ratios[np.isfinite(ratios)]
    if ratios.size < n_boot // 2:
        return float("nan"), float("nan")
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(low), float(high)


def labels(points: Sequence[Point]) -> dict[str, str]:
    """A short label per configuration that tells it apart from the others: Point.label() and,
    where configurations share it, the fields that differ among them (hpcbench.spec.labels)."""
    return spec_labels(points)


def provenance_diff(baseline: Sequence[PointData], new: Sequence[PointData]) -> list[ProvenanceDiff]:
    """The keys whose values differ between the sweeps, sorted by key: versions, libraries,
    hosts and settings; what differs on every run (job ids, daemon addresses, session folders,
    process and thread ids, temporary paths, timestamps) is left out (store/provenance.py:
    PER_RUN_KEYS, PER_RUN_VALUES)."""
    a, b = steady_values(p.provenance for p in baseline), steady_values(p.provenance for p in new)
    return [
        ProvenanceDiff(key, tuple(sorted(a.get(key, ()))), tuple(sorted(b.get(key, ()))))
        for key in sorted(set(a) | set(b))
        if a.get(key) != b.get(key)
    ]


def _order(config: Configuration) -> tuple[Any, ...]:
    p = config.point
    return (p.framework, p.backend, p.launcher, p.model, p.device, p.dataset, p.batch_size, p.nodes,
            p.ranks_per_node, config.key)  # fmt: skip


def _notes(rows: Sequence[Row], configs: dict[str, dict[str, Configuration]], names: dict[str, str]) -> list[str]:
    notes = []
    single = [row for row in rows if min(len(row.baseline_points), len(row.new_points)) == 1]
    if single:
        notes.append(
            f"{len(single)} of {len(rows)} matched configurations have one run in a sweep: their intervals "
            "cover iteration-to-iteration noise only, not run-to-run variation (add repeats: seed: [1, 2, 3])"
        )
    for side, found in configs.items():
        for config in found.values():
            short = [run.point_id for run in config.runs if run.steps.size < MIN_TIMED]
            if short:
                notes.append(f"{side}: {names[config.key]}: fewer than {MIN_TIMED} timed iterations in {short}")
            for name, values in sorted(config.pooled.items()):
                if len(values) > 1:
                    notes.append(f"{side}: {names[config.key]}: pools runs with different {name} "
                                 f"({', '.join(sorted(values))})")  # fmt: skip
    return notes


def compare(
    baseline_dir: Path | str,
    new_dir: Path | str,
    metric: str = "throughput",
    threshold: float = 5.0,
    ignore: Sequence[str] = (),
    n_boot: int = N_BOOT,
    seed: int = SEED,
) -> Comparison:
    """Compare two sweep directories (raises SpecError, exit code 2, on bad input)."""
    chosen, threshold = metric_named(metric), threshold_percent(threshold)
    ignored = ignored_fields(ignore)
    sweeps = {"baseline": _load("BASELINE_DIR", Path(baseline_dir)), "new": _load("NEW_DIR", Path(new_dir))}
    warnings = [f"{side}: {w}" for side, sweep in sweeps.items() for w in sweep.warnings]
    configs, notes = {}, []
    for side, sweep in sweeps.items():
        configs[side], left_out = configurations(sweep.points, list(ignored))
        notes += [f"{side}: {note}" for note in left_out]
    base, new = configs["baseline"], configs["new"]
    everything = {**new, **base}
    names = labels([c.point for c in everything.values()])
    rows = []
    for config in sorted((c for key, c in base.items() if key in new), key=_order):
        other = new[config.key]
        b, n = config.value(chosen), other.value(chosen)
        low, high = ratio_interval(config.runs, other.runs, chosen, config.key, n_boot, seed)
        ratio = n / b if b > 0 else float("nan")
        rows.append(Row(config.key, config.point, b, n, ratio, low, high, tuple(r.point_id for r in config.runs),
                        tuple(r.point_id for r in other.runs), chosen.higher_is_better, threshold))  # fmt: skip
    return Comparison(
        Path(baseline_dir),
        Path(new_dir),
        chosen,
        threshold,
        ignored,
        rows,
        sorted((c for key, c in base.items() if key not in new), key=_order),
        sorted((c for key, c in new.items() if key not in base), key=_order),
        names,
        provenance_diff(sweeps["baseline"].points, sweeps["new"].points),
        warnings,
        notes + _notes(rows, configs, names),
    )
