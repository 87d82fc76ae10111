"""The performance model held out on this machine's quickstart, over repeated runs.

    .venv/bin/python benchmarks/quickstart_model.py [--repeat 4] [--spec analysis/quickstart.yaml]

Runs the sweep `--spec` (default: the quickstart, torch/gloo LeNet-5 on 1, 2 and 4 ranks of
this host, one thread each) `--repeat` times, each into a fresh directory, and analyses each
run: per point, the measured t_iter, the leave-one-scale-out prediction and its error
(`held_out.csv`), whether the point was oversubscribed, and the residual split by phase.
Prints one line per run and point, then per rank count the median and largest |error| over
the runs. Goal: every held-out error within 20 %.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from hpcbench.analysis import pipeline


def run(spec: Path, out: Path) -> pd.DataFrame:
    subprocess.run([sys.executable, "-m", "hpcbench.sweep", str(spec), "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    return pipeline.analyse(out).held_out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=4, help="runs of the sweep (default 4)")
    p.add_argument("--spec", type=Path, default=Path("analysis/quickstart.yaml"), help="the sweep to run")
    args = p.parse_args()
    errors: dict[int, list[float]] = {}
    print("run  ranks  oversubscribed  measured ms  predicted ms   error  exchange miss ms")
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(1, args.repeat + 1):
            held = run(args.spec, Path(tmp) / f"run{k}")
            for row in held.sort_values("ranks").to_dict("records"):
                ranks, error = int(row["ranks"]), float(row["rel_error"])
                errors.setdefault(ranks, []).append(error)
                measured, predicted = 1e3 * float(row["measured_t_iter_s"]), 1e3 * float(row["predicted_t_iter_s"])
                print(f"{k:3d}  {ranks:5d}  {bool(row['oversubscribed'])!s:>14}  {measured:11.2f}  {predicted:12.2f}  "
                      f"{error:+6.1%}  {1e3 * float(row['resid_exchange_s']):16.2f}")  # fmt: skip
    print("ranks  median |error|  max |error|")
    for n, values in sorted(errors.items()):
        absolute = [abs(v) for v in values]
        print(f"{n:5d}  {statistics.median(absolute):14.1%}  {max(absolute):11.1%}")


if __name__ == "__main__":
    main()
