"""PyTorch: DDP over gloo or NCCL, per-parameter MPI all-reduce, or Horovod.

adapter.py is the registered framework; layers.py builds the zoo's networks as torch
modules; exchange.py times every gradient message of each backend."""

from hpcbench.frameworks.torch.adapter import TorchFramework

__all__ = ["TorchFramework"]
