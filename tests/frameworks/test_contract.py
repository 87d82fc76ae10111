"""The framework contract, for every registered framework, without its library: the adapter
modules import anywhere, so their declarations and the checks of planning run wherever a
sweep is planned.

- what each framework declares: its backends, models and datasets, each backend's traits
  (the built-in ones reproduce what the analysis assumed of their files before traits were
  recorded, `store.traits.legacy`), the optimizer's momentum, what a backend needs of its
  launcher and the device a backend runs on;
- the points each refuses at planning (`plan.launch.check_point`: the framework's checks,
  the launcher's, and whether the launcher gives the backend what it needs, asked of the
  launcher's own declarations), each refusal naming its field: one table per framework;
- a rank that came up without MPI for a backend that needs it is refused at set-up too.

That a point file carries the declared traits, written by real ranks, is checked in
test_torch.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from hpcbench.errors import HpcbenchError
from hpcbench.frameworks import FRAMEWORKS, Framework
from hpcbench.frameworks.base import MOMENTUM
from hpcbench.launchers import LAUNCHERS
from hpcbench.plan.launch import check_point
from hpcbench.spec import Point
from hpcbench.store.traits import legacy
from hpcbench.workloads import zoo

NAMES = FRAMEWORKS.names()
BACKENDS = {
    "caffe": {"mpi"},
    "chainer": {"naive", "pure_nccl"},
    "cntk": {"mpi"},
    "jax": {"pmean", "pmean_fused"},
    "mxnet": {"dist_sync", "dist_async", "horovod"},
    "synthetic": {"none"},
    "tensorflow": {"multiworker", "ps", "horovod"},
    "theano": {"mpi"},
    "torch": {"gloo", "nccl", "mpi", "horovod"},
}
# The point a framework's table starts from (two ranks on this host, mpirun); the table's
# fields replace its own.
BASE: dict[str, dict[str, Any]] = {
    "caffe": {"backend": "mpi"},
    "chainer": {"backend": "naive"},
    "cntk": {"backend": "mpi"},
    "jax": {"backend": "pmean"},
    "mxnet": {"backend": "dist_sync"},
    "synthetic": {"backend": "none", "model": "sleep"},
    "tensorflow": {"backend": "multiworker"},
    "theano": {"backend": "mpi"},
    "torch": {"backend": "gloo"},
}
Expected = list[str] | str | tuple[str, str]  # [] (no problem), a field refused, (field, words said)
CASES: dict[str, list[tuple[dict[str, Any], Expected]]] = {
    "caffe": [
        ({}, []),
        ({"model": "resnet50", "launcher": "srun", "optimizer": "momentum"}, []),
        ({"device": "cuda"}, "device"),
        ({"launcher": "torchrun"}, "launcher"),
        ({"launcher": "horovodrun"}, "launcher"),
        ({"optimizer": "adam"}, "optimizer"),
        ({"extra": (("engine", "cudnn"),)}, "extra"),
    ],
    "chainer": [
        ({}, []),
        ({"backend": "pure_nccl", "device": "cuda", "launcher": "srun"}, []),
        ({"backend": "pure_nccl"}, "backend"),  # on the CPU
        ({"device": "cuda"}, "backend"),  # naive on a GPU
        ({"launcher": "torchrun"}, "launcher"),
        ({"launcher": "horovodrun"}, "launcher"),
        ({"extra": (("double_buffering", True),)}, "extra"),
    ],
    "cntk": [
        ({}, []),
        ({"model": "resnet50", "launcher": "srun"}, []),
        ({"device": "cuda"}, "device"),
        ({"launcher": "torchrun"}, "launcher"),
        ({"launcher": "horovodrun"}, "launcher"),
        ({"extra": (("learner", "distributed"),)}, "extra"),
    ],
    "jax": [
        ({}, []),
        ({"backend": "pmean_fused", "model": "cifar10_quick", "launcher": "srun"}, []),
        ({"model": "resnet50"}, []),
        ({"model": "inception_v3", "backend": "pmean_fused"}, []),
        ({"device": "cuda"}, "device"),
        ({"launcher": "torchrun"}, "launcher"),
        ({"launcher": "horovodrun"}, "launcher"),
        ({"model": "alexnet", "dataset": "mnist", "data_dir": "/tmp"}, "model"),  # the input is too small
        ({"backend": "gloo"}, "backend"),
        ({"extra": (("fused", True),)}, "extra"),
    ],
    "mxnet": [
        ({}, []),
        ({"extra": (("servers", 2),)}, []),
        ({"extra": (("servers", 3),)}, ("extra", "servers")),  # more servers than ranks
        ({"extra": (("kvstore", "horovod"),)}, ("extra", "'kvstore' is not")),
        ({"launcher": "torchrun"}, "launcher"),
        ({"launcher": "horovodrun"}, "launcher"),  # the kvstore roles are set up over MPI
        ({"backend": "horovod", "launcher": "horovodrun"}, []),
        ({"backend": "horovod", "launcher": "srun"}, []),
        ({"backend": "kvstore"}, "backend"),
    ],
    "synthetic": [
        ({}, []),
        ({"extra": (("comm_bytes", 1024), ("comm_tensors", 2))}, []),
        ({"extra": (("comm_bytes", 1024),), "launcher": "horovodrun"}, ("extra", "comm_bytes")),
        ({"extra": (("comm_bytes", 1024),), "launcher": "horovodrun", "ranks_per_node": 1}, []),  # nobody to send to
        ({"extra": (("comm_tensors", 2),)}, "extra"),
        ({"extra": (("slow_rank", 2),)}, "extra"),
        ({"launcher": "torchrun"}, "launcher"),  # torchrun starts torch only
    ],
    "tensorflow": [
        ({}, []),
        ({"extra": (("bytes_per_pack", 1 << 20),)}, []),
        ({"backend": "ps", "extra": (("servers", 2), ("sync", True))}, []),
        ({"backend": "ps", "extra": (("servers", 0),)}, "extra"),
        ({"extra": (("sync", True),)}, "extra"),  # a ps setting
        ({"launcher": "horovodrun"}, ("launcher", "cluster addresses")),
        ({"backend": "ps", "launcher": "horovodrun"}, "launcher"),
        ({"backend": "horovod", "launcher": "horovodrun"}, []),
        ({"backend": "horovod", "launcher": "mpirun"}, []),
        ({"backend": "horovod", "launcher": "torchrun"}, "launcher"),
    ],
    "theano": [
        ({}, []),
        ({"model": "cifar10_quick", "launcher": "srun"}, []),
        ({"model": "alexnet"}, []),
        ({"model": "inception_v3", "env": "legacy"}, []),
        ({"model": "alexnet", "env": "modern"}, []),
        # PyTensor's Numba compile of these takes over 20 minutes
        *[({"model": big, "env": "modern"}, ("model", "Numba")) for big in ("googlenet", "resnet50", "inception_v3")],
        ({"device": "cuda"}, "device"),
        ({"launcher": "torchrun"}, "launcher"),
        ({"launcher": "horovodrun"}, "launcher"),
        ({"extra": (("library", "theano"),)}, "extra"),
    ],
    "torch": [
        ({}, []),
        ({"launcher": "torchrun"}, []),
        ({"backend": "nccl", "device": "cuda", "launcher": "torchrun"}, []),
        ({"backend": "nccl"}, "backend"),  # on the CPU
        ({"backend": "mpi", "device": "cuda"}, "backend"),
        ({"backend": "mpi", "launcher": "torchrun"}, ("launcher", "mpi4py")),
        ({"backend": "mpi", "launcher": "horovodrun"}, "launcher"),
        ({"backend": "horovod", "launcher": "horovodrun"}, []),
        ({"backend": "horovod", "launcher": "torchrun"}, ("launcher", "Horovod")),
    ],
}


def framework_point(name: str, **fields: Any) -> Point:
    return Point(**{"framework": name, "ranks_per_node": 2, **BASE.get(name, {}), **fields})


def problems(name: str, **fields: Any) -> list[str]:
    """The point's problems at planning, each as 'field: what is wrong'."""
    return [f"{field}: {what}" for field, what, _ in check_point(framework_point(name, **fields))]


def device_of(cls: type[Framework], backend: str) -> str:
    return cls.backend_devices[backend][0] if backend in cls.backend_devices else "cpu"


@pytest.mark.parametrize("name", NAMES)
def test_each_framework_declares_its_backends_and_their_traits(name: str) -> None:
    cls = FRAMEWORKS.get(name)
    if name in BACKENDS:
        assert set(cls.backends) == BACKENDS[name]
        if name == "synthetic":
            assert cls.models == ("sleep",)
        else:  # every image model; every transformer, or the reason it is not built
            assert set(zoo.IMAGE_NAMES) <= set(cls.models)
            assert set(cls.models) | set(cls.refusals) == set(zoo.NAMES)
            assert all(len(why) > 40 for why in cls.refusals.values())
    assert set(cls.traits) == set(cls.backends), "every backend declares its traits"
    assert set(cls.launcher_needs) <= set(cls.backends)
    assert set(cls.backend_devices) <= set(cls.backends)
    assert cls.momentum == MOMENTUM
    for backend in cls.backends:
        traits = cls.traits_of(backend)
        assert traits.momentum == cls.momentum
        if name in BACKENDS:  # the launcher's part is the worker's to set: as under mpirun here
            assert traits == legacy(name, backend, "mpirun"), backend


@pytest.mark.parametrize("name", NAMES)
def test_every_backend_plans_on_an_mpi_launcher(name: str) -> None:
    cls = FRAMEWORKS.get(name)
    for backend in cls.backends:
        for launcher in ("mpirun", "srun"):
            assert problems(name, backend=backend, device=device_of(cls, backend), launcher=launcher) == [], backend


@pytest.mark.parametrize("name", NAMES)
def test_a_backend_needing_mpi_asks_the_launchers_declarations(name: str) -> None:
    """Under every registered launcher, a backend's need of MPI (or of Horovod's own launcher)
    is refused exactly where the launcher does not declare it, the allowed ones listed from the
    registry; the rank's own guard refuses ranks without MPI."""
    cls = FRAMEWORKS.get(name)
    for backend in cls.backends:
        need = cls.launcher_need(framework_point(name, backend=backend, extra=()))
        for launcher in LAUNCHERS:
            point = framework_point(name, backend=backend, device=device_of(cls, backend), launcher=launcher.name)
            refused = list(cls.check_launcher(point, launcher, LAUNCHERS))
            if need is None or launcher.mpi or (need.horovod and launcher.horovod):
                assert refused == [], (backend, launcher.name)
                continue
            ((field, what, allowed),) = refused
            assert field == "launcher" and repr(launcher.name) in what and need.why in what
            fits = [la.name for la in LAUNCHERS if la.mpi or (need.horovod and la.horovod)]
            assert allowed == ", ".join(fits)
            assert set(fits) >= {"mpirun", "srun"} and ("horovodrun" in fits) == need.horovod
        if need is not None and not need.horovod:
            with pytest.raises(HpcbenchError, match="needs ranks started by an MPI launcher"):
                cls().mpi_ranks(framework_point(name, backend=backend), None)


@pytest.mark.parametrize("name", NAMES)
def test_points_the_adapter_cannot_run_are_refused_at_planning(name: str) -> None:
    for fields, expected in CASES.get(name, [({}, [])]):
        said = problems(name, **fields)
        if isinstance(expected, list):
            assert said == expected, fields
        elif isinstance(expected, str):
            assert any(p.startswith(f"{expected}:") for p in said), (fields, said)
        else:
            field, words = expected
            assert any(p.startswith(f"{field}:") and words in p for p in said), (fields, said)
