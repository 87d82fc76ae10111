"""`python -m hpcbench.frameworks.tensorflow.ps_server CLUSTER_JSON INDEX THREADS`: one TensorFlow
parameter-server task (`tf.distribute.Server(...).join()`), started by a worker rank of the
TensorFlow `ps` backend (see `ps.py`) and ended by it, or by the kernel when that rank
dies (the rank sets PR_SET_PDEATHSIG on it).
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m hpcbench.frameworks.tensorflow.ps_server CLUSTER_JSON INDEX THREADS", file=sys.stderr)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    cluster, index, threads = json.loads(argv[0]), int(argv[1]), int(argv[2])
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads)
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="ps", task_index=index, config=config)
    server.join()  # serves until killed
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
