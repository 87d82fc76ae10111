"""The rank's side of the bridge to CNTK's Python 3.6 process (`child.py`).

CNTK 2.7 runs on Python 3.6 only, hpcbench's rank side on >= 3.10: every rank starts one
CNTK process beside it (`Child`) and drives it with one JSON command per line over a pipe
(its replies come back over a second pipe, so what CNTK prints goes to the rank's log). The
arrays do not travel over the pipes: both processes map one file in shared memory
(`/dev/shm`, else the temporary folder), laid out as `Layout` says: the weights, the
gradients, then one batch of inputs and labels (float32). The rank writes a batch there and
all-reduces the gradients in place; CNTK reads and writes the rest.

`describe` turns the zoo's model into the plain JSON tree `child.py` builds its network from.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hpcbench.errors import HpcbenchError
from hpcbench.workloads import zoo

CHILD = Path(__file__).with_name("child.py")
INTERPRETER = "cntk-python"  # in the environment's bin/, written by envs/build-cntk.sh
VARIABLE = "HPCBENCH_CNTK_PYTHON"  # names another CNTK interpreter
# The rank's MPI job: a CNTK process that saw these would take itself for a rank of it.
_JOB_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "SLURM_STEP_", "HYDRA_", "MPI_LOCALRANKID")


def interpreter() -> Path:
    """CNTK's interpreter: $HPCBENCH_CNTK_PYTHON, else `cntk-python` beside this interpreter."""
    named = os.environ.get(VARIABLE)
    return Path(named) if named else Path(sys.prefix) / "bin" / INTERPRETER


def describe(model: zoo.Model) -> dict[str, Any]:
    """The model as plain JSON data: every layer a dict with its record's fields and `type`."""

    def layer(record: zoo.Layer) -> dict[str, Any]:
        out: dict[str, Any] = {"type": type(record).__name__}
        for field in dataclasses.fields(record):
            value = getattr(record, field.name)
            if field.name in ("body", "shortcut"):
                value = [layer(r) for r in value]
            elif field.name == "branches":
                value = [[layer(r) for r in branch] for branch in value]
            out[field.name] = value
        return out

    return {"input": list(model.input), "classes": model.classes, "layers": [layer(r) for r in model.layers]}


@dataclass(frozen=True)
class Layout:
    """Where each array lies in the shared file (float32 elements)."""

    sizes: tuple[int, ...]  # every parameter's elements, in CNTK's order
    batch: int
    sample: tuple[int, ...]  # one input's shape

    @property
    def total(self) -> int:
        return sum(self.sizes)

    @property
    def elements(self) -> int:
        return 2 * self.total + self.batch * (math.prod(self.sample) + 1)


class Shared:
    """The shared file mapped as numpy views: `weights`, `grads` (one view per parameter),
    `inputs`, `labels`."""

    def __init__(self, layout: Layout, rank: int) -> None:
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        fd, name = tempfile.mkstemp(prefix=f"hpcbench-cntk-{os.getpid()}-{rank}-", dir=folder)
        os.close(fd)
        self.path = Path(name)
        self.layout = layout
        buf = np.memmap(self.path, dtype=np.float32, mode="w+", shape=(layout.elements,))
        total, feature = layout.total, math.prod(layout.sample)
        self.weights_flat, self.grads_flat = buf[:total], buf[total : 2 * total]
        self.weights = _split(self.weights_flat, layout.sizes)
        self.grads = _split(self.grads_flat, layout.sizes)
        self.inputs = buf[2 * total : 2 * total + layout.batch * feature].reshape((layout.batch, *layout.sample))
        self.labels = buf[2 * total + layout.batch * feature :]
        self._buf = buf

    def put(self, x: np.ndarray, y: np.ndarray) -> int:
        """Copy a batch in; returns its samples."""
        n = len(x)
        if n > self.layout.batch:
            raise HpcbenchError(f"a batch of {n} samples does not fit the shared batch of {self.layout.batch}")
        self.inputs[:n] = x
        self.labels[:n] = y
        return n

    def close(self) -> None:
        del self._buf, self.weights, self.grads, self.weights_flat, self.grads_flat, self.inputs, self.labels
        self.path.unlink(missing_ok=True)


def _split(flat: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
    out, start = [], 0
    for n in sizes:
        out.append(flat[start : start + n])
        start += n
    return out


class Child:
    """CNTK's process beside this rank, and the pipes to it."""

    def __init__(self, exe: Path) -> None:
        if not exe.exists():
            raise HpcbenchError(f"CNTK's interpreter {exe} is missing: build the cntk environment (envs/build.sh cntk)")
        cmd_read, self._cmd_write = os.pipe()
        self._reply_read, reply_write = os.pipe()
        env = {k: v for k, v in os.environ.items() if not k.startswith(_JOB_PREFIXES)}
        try:
            self.proc = subprocess.Popen(
                [str(exe), "-I", str(CHILD), str(cmd_read), str(reply_write)],
                pass_fds=(cmd_read, reply_write),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        finally:
            os.close(cmd_read)
            os.close(reply_write)
        self._send = os.fdopen(self._cmd_write, "w")
        self._recv = os.fdopen(self._reply_read, "r")

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        """Send one command and wait for its reply; a failure in CNTK raises here."""
        try:
            self._send.write(json.dumps({"op": op, **args}) + "\n")
            self._send.flush()
        except BrokenPipeError:
            pass  # the process has ended: said below
        line = self._recv.readline()
        if not line:
            code = self.proc.wait(timeout=30)
            raise HpcbenchError(f"CNTK's process ended (exit {code}) during {op!r}; its output is in the rank's log")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            sys.stderr.write(str(reply.get("traceback", "")))
            raise HpcbenchError(f"CNTK failed in {op!r}: {reply['error']}")
        return reply

    def close(self) -> None:
        """Ask the process to end (it also ends when the pipe closes), then wait for it."""
        try:
            self._send.write(json.dumps({"op": "quit"}) + "\n")
            self._send.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._recv.close()
