"""`python -m hpcbench.analyze SWEEP_DIR`: the sweep's scaling table, printed and as summary.csv.

Needs numpy, pandas and h5py only: it runs anywhere the point files can be copied to.
"""

from __future__ import annotations

import argparse
import math
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from hpcbench import textable
from hpcbench.analysis import metrics, tables
from hpcbench.atomic import write_text_atomic
from hpcbench.errors import HpcbenchError

PROG = "hpcbench.analyze"

_SHOWN: list[tuple[str, str, Callable[[Any], str]]] = [
    ("point", "point", str),
    ("framework", "framework", str),
    ("backend", "backend", str),
    ("model", "model", str),
    ("nodes", "nodes", str),
    ("ranks_per_node", "ranks/node", str),
    ("batch_size", "batch", str),
    ("t_iter_s", "t_iter ms", lambda v: f"{v * 1e3:.2f}"),
    ("throughput", "samples/s", lambda v: f"{v:.1f}"),
    ("speedup", "speedup", lambda v: "-" if math.isnan(v) else f"{v:.2f}"),
    ("efficiency", "efficiency", lambda v: "-" if math.isnan(v) else f"{v:.0%}"),
    ("lif", "LIF", lambda v: f"{v:.3f}"),
    ("comm_share", "comm", lambda v: f"{v:.0%}"),
]


def format_table(table: pd.DataFrame) -> str:
    rows = [[title for _, title, _ in _SHOWN]]
    rows += [[fmt(rec[col]) for col, _, fmt in _SHOWN] for rec in table.to_dict("records")]
    return textable.render(rows, right=True)


def cmd_summary(directory: Path, out: TextIO) -> int:
    sweep = tables.load(directory)
    for warning in sweep.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if not sweep.points:
        raise HpcbenchError(f"{directory}: no complete point files to analyse")
    table = metrics.summary([(p.point, p.point_id, p.iterations) for p in sweep.points])
    write_text_atomic(directory / "summary.csv", table.to_csv(index=False))
    print(format_table(table), file=out)
    for note in metrics.warnings_for(table):
        print(f"note: {note}", file=out)
    print(f"wrote {directory / 'summary.csv'} ({len(table)} points)", file=out)
    return 0


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {PROG}", description="Analyse a sweep directory.")
    p.add_argument("dir", help="sweep directory (holding <point>.h5 files)")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")
    args = p.parse_args(argv)
    try:
        return cmd_summary(Path(args.dir), out)
    except HpcbenchError as exc:
        if args.verbose:
            traceback.print_exc()
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
