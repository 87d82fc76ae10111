"""TensorFlow (Keras 3): MultiWorkerMirroredStrategy, parameter servers, or Horovod.

adapter.py is the registered framework; layers.py builds the zoo's networks as Keras
models, blocks.py its transformers; allreduce.py holds the all-reduce backends (multiworker, horovod), ps.py and
ps_server.py the parameter-server backend; stamps.py turns the compiled steps' in-graph
timestamps into marks and messages; cluster.py gathers the servers' addresses."""

from hpcbench.frameworks.tensorflow.adapter import TensorFlowFramework

__all__ = ["TensorFlowFramework"]
