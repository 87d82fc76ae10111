"""Exporting a large sweep: seconds, peak memory, and Parquet bytes over HDF5 bytes.

    python benchmarks/export_scale.py [--dir DIR] [--formats parquet,mllog,json] [--repeat 1]

The sweep is analysis_scale.py's (generated in a child when DIR holds no point files):
one point of 1024 ranks x 10,000 iterations with a message per rank and iteration, plus
200 points of 1..128 ranks x 200 iterations. Then, in a fresh process, runs the export
(`hpcbench.analysis.export.export_sweep`, every format unless --formats says otherwise)
into a new folder beside DIR and prints its wall seconds, its CPU seconds (all threads:
the figure a loaded machine moves least), the load average, the process's peak RSS, the
rows and bytes of every Parquet file, and the Parquet bytes over the point files' bytes.
Goal: <= 10 s on 2 cores, Parquet <= 0.5 of the HDF5 bytes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from analysis_scale import peak_rss_gb  # the sweep's generator and the peak-memory reading

GENERATOR = Path(__file__).resolve().with_name("analysis_scale.py")


def measure(directory: Path, formats: list[str]) -> None:
    from hpcbench.analysis.export import export_sweep

    out = Path(tempfile.mkdtemp(prefix="hpcbench-export-", dir=directory.parent)) / "export"
    try:
        start, cpu = time.perf_counter(), time.process_time()
        result = export_sweep(directory, formats, out)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        peak_gb = peak_rss_gb()
        hdf5 = sum(p.stat().st_size for p in directory.glob("*.h5"))
        parquet = {p.stem: p.stat().st_size for p in result.files if p.suffix == ".parquet"}
        tables = ", ".join(f"{name} {result.rows[name]:,} rows {size / 1e6:,.1f} MB" for name, size in parquet.items())
        load = os.getloadavg()[0]
        print(f"exported {result.points} points ({', '.join(formats)}) in {seconds:.2f} s (CPU {cpu:.2f} s, "
              f"all threads; load average {load:.1f}), peak RSS {peak_gb:.2f} GB")  # fmt: skip
        if parquet:
            total = sum(parquet.values())
            print(f"  Parquet {total / 1e6:,.1f} MB / HDF5 {hdf5 / 1e6:,.1f} MB = {total / hdf5:.3f} ({tables})")
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, help="where the point files are (generated when missing)")
    ap.add_argument("--formats", default="parquet,mllog,json", help="formats to export (comma list)")
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--iterations", type=int, default=10_000)
    ap.add_argument("--points", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=1, help="fresh-process measurements")
    ap.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the fresh process's part
    args = ap.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    if args.measure:
        measure(args.measure, formats)
        return
    with tempfile.TemporaryDirectory(prefix="hpcbench-scale-") as tmp:
        directory = args.dir or Path(tmp) / "sweep"
        if not any(directory.glob("*.h5")):
            t0 = time.perf_counter()
            argv = [sys.executable, str(GENERATOR), "--generate", str(directory), "--ranks", str(args.ranks),
                    "--iterations", str(args.iterations), "--points", str(args.points)]  # fmt: skip
            subprocess.run(argv, check=True)
            print(f"generated {len(list(directory.glob('*.h5')))} point files in {time.perf_counter() - t0:.1f} s")
        for _ in range(args.repeat):
            subprocess.run([sys.executable, __file__, "--measure", str(directory), "--formats", ",".join(formats)],
                           check=True)  # fmt: skip


if __name__ == "__main__":
    main()
