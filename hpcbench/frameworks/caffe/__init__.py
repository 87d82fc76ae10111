"""Caffe 1.0 (CPU) in the `caffe` environment: a Debian 11 root filesystem (envs/build-caffe.sh).

adapter.py is the registered framework (`caffe`, backend `mpi`); prototxt.py writes the zoo's
networks as Caffe prototxt (plain text, no Caffe needed)."""

from hpcbench.frameworks.caffe.adapter import CaffeFramework

__all__ = ["CaffeFramework"]
