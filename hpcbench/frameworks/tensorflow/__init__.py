"""TensorFlow (Keras 3): MultiWorkerMirroredStrategy, parameter servers, or Horovod.

adapter.py is the registered framework; layers.py builds the zoo's networks as Keras
models; ps.py and ps_server.py run the parameter-server backend."""

from hpcbench.frameworks.tensorflow.adapter import TensorFlowFramework

__all__ = ["TensorFlowFramework"]
