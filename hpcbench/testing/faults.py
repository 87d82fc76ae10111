"""Network faults on the nodes of a network lab (hpcbench.testing.netlab), each one undoable.

    with Faults(lab) as faults:
        faults.link_down(3, seconds=4)     # node 3's switch port down, up again after 4 s (a thread)
        faults.link_down(3)                # down until undone (`.undo()`, `link_up(3)`, or the end)
        loss = faults.drop(2, 0.3)         # node 2 drops 30 % of what it sends and receives (nftables)
        loss.counts()                      # (packets seen, packets dropped) so far
        faults.throttle(2, rate_mbit=10)   # node 2's link limited to 10 Mbit/s each way (tc, Lab.shape)
        faults.partition(1, 2)             # nodes 1 and 2 drop each other's packets; both reach the rest
        with faults.drop(2, 0.3):          # a fault is a context manager too: undone at the block's end
            ...

Every fault returns a `Fault` whose `undo()` lifts it (twice is harmless). Leaving the `with`
block, `clear()`, and the interpreter's exit (atexit) lift every fault still active, so a
test that fails never leaves a node down or dropping.

What each does:

* `link_down`: the node's switch port (its veth end on the bridge, `Node.host_dev`) goes down:
  the node's NIC loses carrier, every packet to or from it is lost, its addresses and routes
  stay; TCP connections survive a short outage (retransmitted once it is up again).
* `drop`: an nftables table in the node's namespace drops a random `share` of the packets on
  its output hook, input hook or both (`numgen random`), counting what it sees and drops.
* `throttle`: the lab's own rate limit (`Lab.shape`, HTB on both ends of the link); undone,
  the link gets back the rate it had before (or none).
* `partition`: an nftables table in each of the two nodes' namespaces drops every packet to
  or from the other node's address; both still reach the bridge and every other node.

Needs root, iproute2 and nftables (`ensure_nftables()` installs it with apt-get when missing).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from hpcbench.testing.netlab import Lab, LabError

TABLE_PREFIX = "hpcbench_fault_"


class FaultError(LabError):
    """A fault could not be injected or lifted."""


def ensure_nftables() -> None:
    """`nft` on PATH: installed with apt-get when missing (root only), else a FaultError
    saying how to get it."""
    if shutil.which("nft"):
        return
    if os.geteuid() != 0:
        raise FaultError("nftables: `nft` is missing and only root can install it (apt-get install nftables)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "nftables"]
    done = subprocess.run(install, capture_output=True, text=True, timeout=600, env=env)
    if done.returncode != 0:  # a fresh machine's package lists may be missing
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=600, env=env)
        done = subprocess.run(install, capture_output=True, text=True, timeout=600, env=env)
    if done.returncode != 0 or not shutil.which("nft"):
        raise FaultError(f"nftables: apt-get install nftables failed: {done.stderr.strip()[-300:]}")


def _run(argv: list[str], what: str, stdin: str | None = None) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise FaultError(f"{what}: `{' '.join(argv)}` failed: {done.stderr.strip()[-300:]}")
    return done.stdout


_F = TypeVar("_F", bound="Fault")


class Fault:
    """One injected fault; `undo()` lifts it once."""

    def __init__(self, description: str, undo: Callable[[], None]) -> None:
        self.description = description
        self._undo: Callable[[], None] | None = undo
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self._undo is not None

    def undo(self) -> None:
        with self._lock:
            undo, self._undo = self._undo, None
        if undo is not None:
            undo()

    def __enter__(self: _F) -> _F:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.undo()

    def __repr__(self) -> str:
        return f"Fault({self.description!r}, {'active' if self.active else 'lifted'})"


class Loss(Fault):
    """A `drop` fault, with the counters of its rules."""

    def __init__(self, description: str, undo: Callable[[], None], namespace: str, table: str) -> None:
        super().__init__(description, undo)
        self._namespace, self._table = namespace, table
        self.seen = self.dropped = 0  # the last counts read (kept once undone)

    def counts(self) -> tuple[int, int]:
        """(packets seen, packets dropped) by this fault's rules so far."""
        if self.active:
            self.read()
        return self.seen, self.dropped

    def read(self) -> None:
        """Read the rules' counters into `seen` and `dropped` (while the table is there)."""
        out = _run(_nft(self._namespace, "-j", "list", "table", "inet", self._table), "drop counters")
        counters = [i["counter"]["packets"] for i in _walk(json.loads(out)) if "counter" in i]
        self.seen, self.dropped = sum(counters[0::2]), sum(counters[1::2])  # rule order: count all, count drops


def _walk(obj: object) -> list[dict[str, dict[str, int]]]:
    """Every dict in a parsed `nft -j` listing, in order."""
    found: list[dict[str, dict[str, int]]] = []
    if isinstance(obj, dict):
        found.append(obj)
        for value in obj.values():
            found.extend(_walk(value))
    elif isinstance(obj, list):
        for value in obj:
            found.extend(_walk(value))
    return found


def _nft(namespace: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", namespace, "nft", *args]


class Faults:
    """The fault injector of one lab (see the module doc)."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self._faults: list[Fault] = []
        self._serial = 0
        self._lock = threading.Lock()
        atexit.register(self.clear)

    def __enter__(self) -> Faults:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.clear()

    def clear(self) -> None:
        """Lift every fault still active, the latest first."""
        with self._lock:
            faults, self._faults = self._faults, []
        errors = []
        for fault in reversed(faults):
            try:
                fault.undo()
            except FaultError as exc:  # lift the others all the same
                errors.append(str(exc))
        if errors:
            raise FaultError("; ".join(errors))

    def _keep(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def _table(self, kind: str) -> str:
        with self._lock:
            self._serial += 1
            return f"{TABLE_PREFIX}{kind}{self._serial}"

    # ------------------------------------------------------------------ link ---
    def _set_link(self, node: int, state: str) -> None:
        port = self.lab.node(node).host_dev
        _run(["ip", "link", "set", port, state], f"link {state} on node {node}")
        if state == "up":  # until the bridge forwards on the port again
            deadline = time.monotonic() + 10
            brport = Path("/sys/class/net") / port / "brport" / "state"
            while brport.read_text().strip() != "3" and time.monotonic() < deadline:  # BR_STATE_FORWARDING
                time.sleep(0.02)

    def link_up(self, node: int) -> None:
        self._set_link(node, "up")

    def link_down(self, node: int, seconds: float | None = None) -> Fault:
        """Node `node`'s link down; up again after `seconds` (None: when undone)."""
        if seconds is not None and not seconds > 0:
            raise FaultError(f"seconds: must be > 0 or None, got {seconds!r}")
        self._set_link(node, "down")
        fault = self._keep(Fault(f"node {node} link down", lambda: self.link_up(node)))
        if seconds is not None:
            timer = threading.Timer(seconds, fault.undo)
            timer.daemon = True
            timer.start()
        return fault

    # ------------------------------------------------------------- nftables ---
    def _nft_table(self, node: int, kind: str, chains: dict[str, list[str]]) -> tuple[str, str, Callable[[], None]]:
        """Add a table with `chains` (hook name -> rules) in the node's namespace; (namespace,
        table, its undo)."""
        ensure_nftables()
        ns, table = self.lab.node(node).namespace, self._table(kind)
        body = "".join(
            f"  chain {hook} {{\n    type filter hook {hook} priority 0; policy accept;\n"
            + "".join(f"    {rule}\n" for rule in rules)
            + "  }\n"
            for hook, rules in chains.items()
        )
        _run(_nft(ns, "-f", "-"), f"{kind} on node {node}", stdin=f"table inet {table} {{\n{body}}}\n")

        def undo() -> None:
            _run(_nft(ns, "delete", "table", "inet", table), f"lifting {kind} on node {node}")

        return ns, table, undo

    def drop(self, node: int, share: float, direction: str = "both") -> Loss:
        """Node `node` drops a random `share` (0 < share <= 1) of its packets: those it sends
        ("out"), receives ("in") or both."""
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
            raise FaultError(f"share: must be a number in (0, 1], got {share!r}")
        hooks = {"out": ["output"], "in": ["input"], "both": ["input", "output"]}.get(direction)
        if hooks is None:
            raise FaultError(f"direction: must be 'in', 'out' or 'both', got {direction!r}")
        per_10k = round(share * 10_000)
        rules = ["counter", f"numgen random mod 10000 < {per_10k} counter drop"]
        ns, table, undo = self._nft_table(node, "drop", dict.fromkeys(hooks, rules))
        loss = Loss(f"node {node} drops {share:.0%} ({direction})", lambda: None, ns, table)

        def lift() -> None:
            loss.read()  # the last counts, kept
            undo()

        loss._undo = lift
        self._keep(loss)
        return loss

    def partition(self, a: int, b: int) -> Fault:
        """Nodes `a` and `b` lose each other (both directions); each still reaches the rest."""
        if a == b:
            raise FaultError(f"partition: needs two different nodes, got {a} and {b}")
        undos = []
        for here, there in ((a, b), (a, b)[::-1]):
            peer = self.lab.node(there).address
            chains = {"input": [f"ip saddr {peer} drop"], "output": [f"ip daddr {peer} drop"]}
            try:
                undos.append(self._nft_table(here, "partition", chains)[2])
            except FaultError:
                for undo in undos:
                    undo()
                raise

        def undo_both() -> None:
            for undo in undos:
                undo()

        return self._keep(Fault(f"nodes {a} and {b} partitioned", undo_both))

    # ------------------------------------------------------------------- tc ---
    def throttle(self, node: int, rate_mbit: float) -> Fault:
        """Node `node`'s link limited to `rate_mbit` each way (Lab.shape); undone, the rate it had."""
        before = self.lab.shaping.get(node)
        self.lab.shape(node, rate_mbit)

        def restore() -> None:
            if before is None:
                self.lab.unshape(node)
            else:
                self.lab.shape(node, before.rate_mbit, burst_kbit=before.burst_kbit, queue_packets=before.queue_packets)

        return self._keep(Fault(f"node {node} throttled to {rate_mbit:g} Mbit/s", restore))
