"""Chainer 7.8 with ChainerMN (legacy environment): `naive` on CPUs, `pure_nccl` on GPUs.

adapter.py is the registered framework; layers.py builds the zoo's networks as Chainer
links; exchange.py times every gradient message of ChainerMN's communicator."""

from hpcbench.frameworks.chainer.adapter import ChainerFramework

__all__ = ["ChainerFramework"]
