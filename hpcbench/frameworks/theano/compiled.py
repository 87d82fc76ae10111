"""A cache of Theano's compiled functions, keyed by their graphs.

Theano keeps the C code of every op it compiles (`base_compiledir`), but not the graph
rewrites that make a function: about 45 s of ResNet-50's forward and backward functions on
a 2-core machine, redone by every rank of every point. `functions` pickles the functions it
compiles under `library.cache_dir(name)/functions/<key>.pkl`; a later build of the same
graphs (another rank, another point, another run) unpickles them instead (ResNet-50: about
13 s against about 50 s to compile, its C code cached).

The key is a SHA-256 of everything a compiled function depends on: the graphs before any
rewrite, node by node (each op's class and parameters, the inputs' positions and types,
every constant's bytes, every shared variable's name, type, shape and dtype, each update,
each function's inputs and keyword arguments), the library and this cache's format
version, and the library's whole configuration (mode, linker, optimizer, flags). A change
of model, layer code, optimizer, learning rate, library or flags gives another key, so it
compiles again. The shared variables' values are not in the key (they are not in the
pickle either): the weights, running statistics, optimizer slots and the dropout masks'
random states of the build at hand are copied into the unpickled functions' variables, so
a rank with another seed reuses what a rank with the first one compiled.

Theano only: PyTensor's functions (Numba's linker) are compiled as they are, their machine
code cached by Numba itself (`NUMBA_CACHE_DIR`). The files are pickles, read only from the
cache directory of this interpreter (the same trust as Theano's own compiled modules there);
one that cannot be read is compiled again and replaced (a cache directory that cannot be
written to only means compiling every time, said in the rank's log). Nothing is evicted:
one file per distinct graph (ResNet-50's four functions: about 80 MB, AlexNet's 3 MB)."""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hpcbench.frameworks.theano.library import Library, cache_dir

FORMAT = 1  # this cache's layout: part of every key
_DEPTH = 200_000  # a deep graph pickles recursively (ResNet-50's needs a limit above 2,000)
_STACK = 1 << 28  # ... so it is pickled on a thread of a large stack (256 MiB)
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # in a default repr: differs from process to process


@dataclass(frozen=True)
class Spec:
    """One function to compile: `lib.module.function(inputs, outputs, updates=updates, **kwargs)`."""

    inputs: Sequence[Any]
    outputs: Sequence[Any]
    updates: Sequence[tuple[Any, Any]] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Compiled:
    """The compiled functions by name, the shared variables they read (the given ones first,
    in their order, then the others the graphs hold: optimizer slots, random states), and
    whether they came from the cache."""

    functions: dict[str, Any]
    shared: list[Any]
    loaded: bool


def functions(lib: Library, specs: Mapping[str, Spec], shared: Sequence[Any], root: Path | None = None) -> Compiled:
    """`specs` compiled, or unpickled from the cache (Theano) when the same graphs were
    compiled before; `shared` are the variables the caller reads back (weights, running
    statistics): in `Compiled.shared` at the same positions, the ones the functions use."""
    if lib.name != "theano":
        return Compiled(_compile(lib, specs), list(shared), loaded=False)
    every = _shared_of(lib, specs, shared)
    path = (root or cache_dir(lib.name)) / "functions" / f"{_digest(lib, specs, every)}.pkl"
    found = _load(path, len(every))
    if found is not None:
        fns, theirs = found
        for mine, other in zip(every, theirs, strict=True):
            other.set_value(mine.get_value(borrow=True), borrow=True)
        return Compiled(fns, theirs, loaded=True)
    fns = _compile(lib, specs)
    try:
        _store(path, fns, every)
    except Exception as exc:  # noqa: BLE001 - a cache: the functions work, the next build compiles again
        print(f"hpcbench: Theano's functions not cached in {path.parent}: {exc!r}", file=sys.stderr, flush=True)
    return Compiled(fns, every, loaded=False)


def key(lib: Library, specs: Mapping[str, Spec], shared: Sequence[Any] = ()) -> str:
    """The SHA-256 (hex) of what the compiled functions of `specs` depend on (module doc);
    `shared` as `functions` is given it."""
    return _digest(lib, specs, _shared_of(lib, specs, shared))


def _digest(lib: Library, specs: Mapping[str, Spec], every: Sequence[Any]) -> str:
    """`key`, `every` being all the shared variables already (`_shared_of`)."""
    digest = hashlib.sha256()
    for part in _described(lib, specs, every):
        digest.update(part.encode())
        digest.update(b"\n")
    return digest.hexdigest()


def _described(lib: Library, specs: Mapping[str, Spec], shared: Sequence[Any]) -> Iterator[str]:
    yield f"format {FORMAT} {lib.name} {lib.version} numpy {np.__version__} python {sys.version_info[:3]}"
    yield _ADDRESS.sub("", str(lib.module.config))  # every flag and setting, less addresses
    ids: dict[int, int] = {}

    def ref(variable: Any) -> str:
        if id(variable) not in ids:
            ids[id(variable)] = len(ids)
        return f"v{ids[id(variable)]}"

    yield "shared " + " ".join(f"{ref(v)}:{_leaf(lib, v)}" for v in shared)
    for name, spec in sorted(specs.items()):
        ends = [*spec.outputs, *(new for _, new in spec.updates)]
        yield f"function {name} {sorted((k, repr(v)) for k, v in spec.kwargs.items())}"
        yield "inputs " + " ".join(f"{ref(v)}:{_leaf(lib, v)}" for v in spec.inputs)
        for node in lib.module.gof.graph.io_toposort(_leaves(lib, ends), ends):
            for variable in node.inputs:
                if variable.owner is None and id(variable) not in ids:
                    yield f"leaf {ref(variable)} {_leaf(lib, variable)}"
            yield (
                f"node {_op(node.op)} {node.op} ({' '.join(ref(v) for v in node.inputs)}) -> "
                f"({' '.join(f'{ref(v)}:{v.type}' for v in node.outputs)})"
            )
        yield "outputs " + " ".join(ref(v) for v in spec.outputs)
        yield "updates " + " ".join(f"{ref(old)}={ref(new)}" for old, new in spec.updates)


def _op(value: Any) -> str:
    """An op and its parameters (`__props__`, an op's among them too), without the memory
    addresses a default repr holds: the same in every process."""
    if hasattr(value, "_props_dict"):
        props = ", ".join(f"{k}={_op(v)}" for k, v in sorted(value._props_dict().items()))
        return f"{type(value).__module__}.{type(value).__qualname__}({props})"
    return _ADDRESS.sub("", repr(value))


def _leaf(lib: Library, variable: Any) -> str:
    """A graph input: its type, and a constant's bytes or a shared variable's name, shape
    and dtype (not its values)."""
    if isinstance(variable, lib.module.compile.SharedVariable):
        value = variable.get_value(borrow=True)
        return f"shared {variable.name} {variable.type} {np.shape(value)} {np.asarray(value).dtype}"
    data = getattr(variable, "data", None)
    if data is not None:
        array = np.asarray(data)
        return f"constant {variable.type} {array.dtype} {array.shape} {hashlib.sha256(array.tobytes()).hexdigest()}"
    return f"input {variable.name} {variable.type}"


def _leaves(lib: Library, ends: Sequence[Any]) -> list[Any]:
    return [v for v in lib.module.gof.graph.inputs(ends) if v.owner is None]


def _shared_of(lib: Library, specs: Mapping[str, Spec], given: Sequence[Any]) -> list[Any]:
    """`given`, then every other shared variable the graphs read or update, in graph order."""
    out, seen = list(given), {id(v) for v in given}
    for _, spec in sorted(specs.items()):
        ends = [*spec.outputs, *(new for _, new in spec.updates)]
        candidates = [*_leaves(lib, ends), *(old for old, _ in spec.updates)]
        for variable in candidates:
            if isinstance(variable, lib.module.compile.SharedVariable) and id(variable) not in seen:
                seen.add(id(variable))
                out.append(variable)
                update = getattr(variable, "default_update", None)  # a random stream's own update
                if update is not None:
                    for inner in _leaves(lib, [update]):
                        if isinstance(inner, lib.module.compile.SharedVariable) and id(inner) not in seen:
                            seen.add(id(inner))
                            out.append(inner)
    return out


def _compile(lib: Library, specs: Mapping[str, Spec]) -> dict[str, Any]:
    return {
        name: lib.module.function(list(s.inputs), list(s.outputs), updates=list(s.updates), **s.kwargs)
        for name, s in specs.items()
    }


def _deep(work: Callable[[], Any]) -> Any:
    """`work()` on a thread of a large stack, under a high recursion limit: pickling a deep
    graph recurses once per node along its longest path."""
    result: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            errors.append(exc)

    limit, size = sys.getrecursionlimit(), threading.stack_size()
    sys.setrecursionlimit(max(limit, _DEPTH))
    try:
        threading.stack_size(_STACK)
        thread = threading.Thread(target=run, name="theano-function-cache")
        thread.start()
        thread.join()
    finally:
        threading.stack_size(size)
        sys.setrecursionlimit(limit)
    if errors:
        raise errors[0]
    return result[0]


def _store(path: Path, fns: dict[str, Any], shared: list[Any]) -> None:
    """Pickle the functions and their shared variables, the variables emptied first (their
    values are the build's, copied in when loaded), atomically: a rank reading it at the
    same time sees the whole file or none."""
    values = [v.get_value(borrow=True) for v in shared]
    try:
        for variable, value in zip(shared, values, strict=True):
            variable.set_value(np.zeros((0,) * np.ndim(value), np.asarray(value).dtype), borrow=True)
        blob = _deep(lambda: pickle.dumps((FORMAT, fns, shared), protocol=pickle.HIGHEST_PROTOCOL))
    finally:
        for variable, value in zip(shared, values, strict=True):
            variable.set_value(value, borrow=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _load(path: Path, count: int) -> tuple[dict[str, Any], list[Any]] | None:
    """The functions and shared variables pickled at `path`, or None: no such file, or one
    that does not unpickle into `count` shared variables (then it is compiled again)."""
    try:
        blob = path.read_bytes()
    except OSError:  # none yet, or not readable by this user: compile
        return None
    try:
        version, fns, shared = _deep(lambda: pickle.loads(blob))  # noqa: S301 - this interpreter's own cache
    except Exception:  # noqa: BLE001 - a damaged or foreign file: compile again, and replace it
        return None
    if version != FORMAT or len(shared) != count or not all(f is not None for f in fns.values()):
        return None
    return fns, shared
