"""Aggregating a large sweep into every metric: seconds and peak memory.

    python benchmarks/analysis_scale.py [--dir DIR] [--ranks 1024] [--iterations 10000] [--points 200]
                                        [--small-points 10000] [--repeat 3]

Writes (once; an existing DIR with the files is reused) synthetic point files through the
real writer: one point of 1024 ranks x 10,000 iterations (one gradient message per rank
and iteration, one resource sample per rank and second of run, an evaluation per rank at
the end), plus a 200-point sweep (25 configurations x 8 scales, 1..128 ranks, 200
iterations each, with messages, resource samples and 5 evaluations per rank). Then, in a
fresh process, runs the whole analysis from the files, the cache bypassed
(`hpcbench.analysis.pipeline.analyse`: reading every file, the stats, repeats, evaluations and
prediction tables, the stragglers) and prints its wall seconds and the process's peak RSS
(VmHWM), and the seconds of the straggler analysis and message exposure alone; then, each in a
fresh process, the analysis that writes the cache (DIR/.hpcbench-cache) and the re-analysis
of the unchanged sweep from it. `--small-points N` adds a sweep of N small points (1 and 2
ranks x 50 iterations, with messages, resource samples and an evaluation) in DIR-small<N>,
analysed the same ways. Goals: <= 3 s from the files (the straggler part <= 0.5 s of it) and
<= 2 GB, the re-analysis <= 0.5 s; the 10,000 small points <= 30 s. A sweep with 400 or more
files to read is read and derived by worker processes (hpcbench/analysis/derive_pool.py), one
per CPU; HPCBENCH_ANALYSIS_WORKERS=1 measures one process alone.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from hpcbench.analysis.cache import CACHE_DIR
from hpcbench.spec import Point
from hpcbench.store import schema
from hpcbench.testing.fabricate import write_point_file

PERIOD = 0.1  # seconds per iteration of the generated points
PHASES = {"data": 0.002, "h2d": 0.001, "forward": 0.03, "backward": 0.045, "comm": 0.008, "update": 0.004}
MODELS = ("lenet", "mlp", "alexnet", "resnet50", "googlenet")
BATCHES = (8, 16, 32, 64, 128)
SCALES = (1, 2, 4, 8, 16, 32, 64, 128)


def generate_arrays(
    n_ranks: int, n_iters: int, seed: int, warmup: int = 10, evaluations: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(iterations, comm, resources, eval) of one point, with noise."""
    rng = np.random.default_rng(seed)
    it = np.zeros((n_ranks, n_iters), dtype=schema.ITERATION_DTYPE)
    total = np.zeros((n_ranks, n_iters))
    for name, seconds in PHASES.items():
        values = seconds * (1.0 + 0.05 * rng.random((n_ranks, n_iters)))
        it[name] = values
        total += values
    start = np.arange(n_iters) * PERIOD + 1e-4 * np.arange(n_ranks)[:, None]
    it["t_start"] = start
    it["t_end"] = start + total
    it["comm_total"] = it["comm"] + 0.02
    it["samples"] = 32
    it["loss"] = 1.0
    it["warmup"][:, :warmup] = 1
    del total
    n = n_ranks * n_iters
    comm = np.zeros(n, dtype=schema.COMM_DTYPE)
    comm["rank"] = np.repeat(np.arange(n_ranks, dtype=np.int32), n_iters)
    comm["iteration"] = np.tile(np.arange(n_iters, dtype=np.int32), n_ranks)
    comm["op"] = b"allreduce"
    comm["name"] = b"0"
    comm["dtype"] = b"float32"
    comm["bytes"] = 250_000
    ready = (it["t_start"] + it["data"] + it["h2d"] + it["forward"] + it["backward"]).reshape(-1)
    comm["t_start"] = ready - 0.01
    comm["t_end"] = ready + it["comm"].reshape(-1)
    del ready
    samples = max(1, int(n_iters * PERIOD))
    res = np.zeros(n_ranks * samples, dtype=schema.RESOURCE_DTYPE)
    res["rank"] = np.repeat(np.arange(n_ranks, dtype=np.int32), samples)
    res["t"] = np.tile(np.arange(samples, dtype=float), n_ranks)
    res["cpu_user"] = 60 + 10 * rng.random(len(res))
    res["cpu_system"] = 10 + 5 * rng.random(len(res))
    res["cpu_iowait"] = rng.random(len(res))
    res["rss_bytes"] = (500 + 100 * rng.random(len(res))) * 2**20
    res["gpu_util"] = np.nan
    res["gpu_mem_bytes"] = -1
    res["gpu_power_w"] = np.nan
    res["gpu_sm_clock_mhz"] = np.nan
    res["ib_rx_bytes"] = -1
    res["ib_tx_bytes"] = -1
    ev = np.zeros(n_ranks * evaluations, dtype=schema.EVAL_DTYPE)
    ev["rank"] = np.repeat(np.arange(n_ranks, dtype=np.int32), evaluations)
    epochs = np.tile(np.arange(1, evaluations + 1, dtype=np.int32), n_ranks)
    ev["epoch"] = epochs
    ev["iteration"] = epochs * n_iters // evaluations
    ev["train_time_s"] = epochs * n_iters * PERIOD / evaluations
    ev["test_time_s"] = 1.0
    ev["total"] = 100
    ev["correct"] = np.minimum(100, 50 + 10 * epochs)
    return it, comm, res, ev


def generate(directory: Path, ranks: int, iterations: int, points: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    big = Point(framework="torch", backend="nccl", device="cuda", model="resnet50", nodes=ranks // 8,
                ranks_per_node=8, batch_size=32, iterations=iterations - 10)  # fmt: skip
    it, comm, res, ev = generate_arrays(ranks, iterations, seed=1)
    write_point_file(directory / f"{big.id}.h5", big, it, comm=comm, resources=res, evals=ev)
    del it, comm, res, ev
    count = 0
    for model in MODELS:
        for batch in BATCHES:
            for n in SCALES:
                if count == points:
                    return
                p = Point(model=model, batch_size=batch, ranks_per_node=n, iterations=190)
                arrays = generate_arrays(n, 200, seed=count + 2, evaluations=5)
                write_point_file(directory / f"{p.id}.h5", p, arrays[0], comm=arrays[1], resources=arrays[2],
                                 evals=arrays[3])  # fmt: skip
                count += 1


def generate_small(directory: Path, points: int) -> None:
    """`points` small points: 1 and 2 ranks x 50 iterations of 5 models x 5 batch sizes, repeated with seeds."""
    directory.mkdir(parents=True, exist_ok=True)
    for k in range(points):
        model, batch, n = MODELS[k % 5], BATCHES[k // 5 % 5], 1 + k // 25 % 2
        p = Point(model=model, batch_size=batch, ranks_per_node=n, iterations=40, seed=k // 50)
        arrays = generate_arrays(n, 50, seed=k, warmup=10)
        write_point_file(directory / f"{p.id}.h5", p, arrays[0], comm=arrays[1], resources=arrays[2],
                         evals=arrays[3])  # fmt: skip


def peak_rss_gb() -> float:
    """This process's own peak resident set (VmHWM). Not ru_maxrss: across exec, Linux keeps the
    larger of the old and the new image's peaks, so a child started by a parent that had just
    generated the files (gigabytes of arrays) reported the parent's peak as its own."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def measure(directory: Path, mode: str) -> None:
    """One analysis of `directory` in this fresh process: from the files (`files`, the cache
    bypassed), or with the cache (`cached`: writing it where it is not yet there, else reading it)."""
    from hpcbench.analysis import pipeline
    from hpcbench.analysis.stragglers import exposure
    from hpcbench.analysis.stragglers import find as stragglers

    start = time.perf_counter()
    analysis = pipeline.analyse(directory, use_cache=mode == "cached")
    seconds = time.perf_counter() - start
    peak_gb = peak_rss_gb()
    biggest = int(analysis.stats["ranks"].max())
    cells = int((analysis.stats["ranks"] * analysis.stats["timed_iterations"]).sum())
    what = f"analysed {len(analysis.stats)} points (largest {biggest} ranks; {cells:,} timed rank-iterations)"
    if mode == "cached":
        c = analysis.cache
        print(f"{what} with the cache ({c.hits} entries read, {c.written} written, model "
              f"{'read' if c.sweep_hit else 'computed'}): {seconds:.2f} s, peak RSS {peak_gb:.2f} GB")  # fmt: skip
        return
    # the straggler part again, alone: the messages' exposure pass and the attribution and replay
    start = time.perf_counter()
    exposures = {p.point_id: exposure.of(p.iterations, p.comm) for p in analysis.data}
    stragglers.analyse(analysis.data, exposures)
    slow_seconds = time.perf_counter() - start
    print(
        f"{what}, {len(analysis.predictions)} predictions, from the files: {seconds:.2f} s, peak RSS "
        f"{peak_gb:.2f} GB; of which straggler analysis and message exposure {slow_seconds:.2f} s"
    )


def measure_all(directory: Path, repeat: int) -> None:
    """`repeat` analyses from the files, then the cache written once and read `repeat` times,
    each in a fresh process."""
    shutil.rmtree(directory / CACHE_DIR, ignore_errors=True)
    for _ in range(repeat):
        subprocess.run([sys.executable, __file__, "--measure", str(directory), "--mode", "files"], check=True)
    for _ in range(repeat + 1 if repeat else 0):  # the first writes the entries
        subprocess.run([sys.executable, __file__, "--measure", str(directory), "--mode", "cached"], check=True)


def generated(directory: Path, argv: list[str]) -> None:
    """Generate the files of `directory` in a child (this process stays small, so the measuring
    children start from a small image), unless it holds some."""
    if any(directory.glob("*.h5")):
        return
    t0 = time.perf_counter()
    subprocess.run([sys.executable, __file__, *argv], check=True)
    print(f"generated {len(list(directory.glob('*.h5')))} point files in {time.perf_counter() - t0:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, help="where the point files are (generated when missing)")
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--iterations", type=int, default=10_000)
    ap.add_argument("--points", type=int, default=200)
    ap.add_argument("--small-points", type=int, default=0, help="also a sweep of this many small points")
    ap.add_argument("--repeat", type=int, default=3, help="fresh-process measurements of each kind")
    ap.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the fresh process's part
    ap.add_argument("--mode", default="files", choices=("files", "cached"), help=argparse.SUPPRESS)
    ap.add_argument("--generate", type=Path, help=argparse.SUPPRESS)  # the generating child's part
    ap.add_argument("--generate-small", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.generate:
        generate(args.generate, args.ranks, args.iterations, args.points)
        return
    if args.generate_small:
        generate_small(args.generate_small, args.small_points)
        return
    if args.measure:
        measure(args.measure, args.mode)
        return
    with tempfile.TemporaryDirectory(prefix="hpcbench-scale-") as tmp:
        directory = args.dir or Path(tmp) / "sweep"
        directory.mkdir(parents=True, exist_ok=True)
        generated(directory, ["--generate", str(directory), "--ranks", str(args.ranks),
                              "--iterations", str(args.iterations), "--points", str(args.points)])  # fmt: skip
        measure_all(directory, args.repeat)
        if args.small_points:
            small = directory.with_name(f"{directory.name}-small{args.small_points}")
            generated(small, ["--generate-small", str(small), "--small-points", str(args.small_points)])
            measure_all(small, args.repeat)


if __name__ == "__main__":
    main()
