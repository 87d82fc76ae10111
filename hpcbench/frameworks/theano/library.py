"""Which of Theano and PyTensor this interpreter has, set up before it is imported.

Theano 1.0.5 (the `legacy` environment: numpy < 1.24, scipy < 1.12) is taken where it
imports, else PyTensor, its maintained successor (the `modern` environment); both give the
same tensor API for what the adapter uses. Before the import:

- Theano: `THEANO_FLAGS` gets `floatX=float32`, an empty `blas.ldflags` (without it the
  import fails looking for a BLAS to link against: it then calls numpy's),
  `base_compiledir`, a compile cache per interpreter, and `compile.wait=1`: a rank that
  finds the cache locked by another (the ranks of a host share it) tries again after 1-2 s
  instead of Theano's 5-10 s (ResNet-50's functions compile 4 modules of their own in every
  process, each under the lock);
- PyTensor: `PYTENSOR_FLAGS` gets `floatX=float32` and `base_compiledir`, and
  `NUMBA_CACHE_DIR` the same cache (its default linker compiles through Numba).

Settings already in those variables win. The caches live in `$HPCBENCH_CACHE` (default
`~/.cache/hpcbench`), under `theano/` or `pytensor/` and the versions of Python, the library
and numpy, so every environment and rank reuses its compiled graphs (the first compile takes
15-20 s for a small model, minutes for AlexNet and ResNet-50), and so does an environment
built again in a fresh clone.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAMES = ("theano", "pytensor")


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def cache_dir(name: str) -> Path:
    """The compile cache of library `name` for this interpreter: one per Python, library and
    numpy version, not per environment, so that environments built again (a fresh clone's)
    find what the last one compiled: the library keys each compiled module by its code and
    its compiler's flags within it."""
    root = Path(os.environ.get("HPCBENCH_CACHE") or Path.home() / ".cache" / "hpcbench")
    python = f"py{sys.version_info[0]}{sys.version_info[1]}"
    return root / name / f"{python}-{name}{_version(name)}-numpy{_version('numpy')}"


def _add_flags(variable: str, flags: dict[str, str]) -> None:
    current = os.environ.get(variable, "")
    given = {item.split("=", 1)[0].strip() for item in current.split(",") if "=" in item}
    added = [f"{key}={value}" for key, value in flags.items() if key not in given]
    os.environ[variable] = ",".join(part for part in (current, *added) if part)


def available() -> str | None:
    """The library this interpreter would use (without importing it), or None."""
    for name in NAMES:
        if importlib.util.find_spec(name) is not None:
            return name
    return None


@dataclass(frozen=True)
class Library:
    name: str
    version: str
    module: Any  # theano | pytensor
    tensor: Any  # theano.tensor | pytensor.tensor

    @property
    def native_conv(self) -> Any | None:
        """Theano's conv2d and pool_2d (None in PyTensor, which has neither)."""
        nnet = getattr(self.tensor, "nnet", None)
        return nnet if nnet is not None and hasattr(nnet, "conv2d") else None

    def uniform(self, seed: int, shape: Any) -> tuple[Any, list[tuple[Any, Any]]]:
        """Uniform float32 samples in [0, 1) of (symbolic) `shape` from a random stream of
        its own seeded with `seed`, drawn anew at every call of the function that computes
        them, and the updates that advance the stream: Theano's MRG streams
        (`theano.sandbox.rng_mrg`, C code) advance themselves (`default_update`, no update
        to give); PyTensor's shared generator (`pytensor.tensor.random.shared_rng`) needs its
        update in the function."""
        if self.name == "theano":
            rng_mrg = importlib.import_module("theano.sandbox.rng_mrg")
            return rng_mrg.MRG_RandomStreams(seed).uniform(size=shape, dtype="float32"), []
        random = importlib.import_module("pytensor.tensor.random")
        rng = random.shared_rng(seed=seed, name=f"rng{seed}")
        following, sample = rng.uniform(0.0, 1.0, size=shape, dtype="float32")
        return sample, [(rng, following)]

    def flags(self) -> dict[str, str]:
        out = {f"{self.name}_flags": os.environ.get(f"{self.name.upper()}_FLAGS", "")}
        config = self.module.config
        out[f"{self.name}_mode"] = str(config.mode)
        out[f"{self.name}_linker"] = str(config.linker)
        out[f"{self.name}_floatx"] = str(config.floatX)
        return out


def load(prefer: str | None = None) -> Library:
    """Set the library's flags and import it: `prefer` if given, else Theano where it imports,
    else PyTensor. Raises the last ImportError when neither imports."""
    error: Exception | None = None
    for name in (prefer,) if prefer else NAMES:
        if name is None or importlib.util.find_spec(name) is None:
            continue
        cache = cache_dir(name)
        cache.mkdir(parents=True, exist_ok=True)
        if name == "theano":
            flags = {"floatX": "float32", "blas.ldflags": "", "base_compiledir": str(cache), "compile.wait": "1"}
            _add_flags("THEANO_FLAGS", flags)
        else:
            _add_flags("PYTENSOR_FLAGS", {"floatX": "float32", "base_compiledir": str(cache)})
            os.environ.setdefault("NUMBA_CACHE_DIR", str(cache / "numba"))
        try:
            module = importlib.import_module(name)
            tensor = importlib.import_module(f"{name}.tensor")
        except Exception as exc:  # noqa: BLE001 - try the other library; raised below if none works
            error = exc
            continue
        return Library(name, str(module.__version__), module, tensor)
    raise ImportError(f"neither Theano nor PyTensor imports here: {error or 'not installed'}")
