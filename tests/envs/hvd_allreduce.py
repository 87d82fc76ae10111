"""Run by every rank under mpirun: `PYTHON hvd_allreduce.py torch|tensorflow|mxnet`.

Rank r all-reduces (sum) a vector of three (r + 1)s through horovod.<framework> and prints
one line `RESULT <json>` with its rank, the size, whether MPI runs the ranks, and the sum.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any


def allreduce(framework: str) -> tuple[Any, list[float]]:
    hvd = importlib.import_module(f"horovod.{framework}")
    hvd.init()
    value = [float(hvd.rank() + 1)] * 3
    if framework == "torch":
        torch = importlib.import_module("torch")
        total = hvd.allreduce(torch.tensor(value), op=hvd.Sum, name="smoke").tolist()
    elif framework == "tensorflow":
        tf = importlib.import_module("tensorflow")
        total = hvd.allreduce(tf.constant(value), op=hvd.Sum, name="smoke").numpy().tolist()
    elif framework == "mxnet":
        mx = importlib.import_module("mxnet")
        total = hvd.allreduce(mx.nd.array(value), op=hvd.Sum, name="smoke").asnumpy().tolist()
    else:
        raise SystemExit(f"unknown framework {framework!r}")
    return hvd, total


def main() -> None:
    hvd, total = allreduce(sys.argv[1])
    line = {"rank": hvd.rank(), "size": hvd.size(), "mpi": bool(hvd.mpi_enabled()), "sum": total}
    # One write per line: the ranks share mpirun's stdout.
    sys.stdout.write("RESULT " + json.dumps(line) + "\n")
    sys.stdout.flush()
    hvd.shutdown()


if __name__ == "__main__":
    main()
