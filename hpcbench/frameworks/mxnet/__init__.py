"""MXNet 1.9 (Gluon): kvstore dist_sync / dist_async, or Horovod.

adapter.py is the registered framework; kvstore.py starts the parameter-server roles;
exchange.py exchanges and times the gradients of each backend; layers.py builds the zoo's
networks as Gluon blocks; engine.py stamps the engine's callbacks; ps.py counts
parameter-server updates."""

from hpcbench.frameworks.mxnet.adapter import MXNetFramework

__all__ = ["MXNetFramework"]
