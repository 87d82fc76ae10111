"""A network lab on this host: virtual nodes, each in its own network namespace, joined by a
bridge, with an optional rate limit on each node's link. Needs root and iproute2 (`ip`, `tc`).

    with Lab(nodes=4, subnet="10.231.0.0/24", prefix="hbn") as lab:
        node = lab.node(1)                 # nodes are numbered from 1
        node.namespace                     # "hbn1"  (/run/netns/hbn1)
        node.address                       # "10.231.0.2"  (node i has host number i + 1)
        node.node_dev, node.host_dev       # "hbn1n" inside the namespace, "hbn1h" on the bridge
        lab.bridge, lab.bridge_address     # "hbnbr", "10.231.0.1" (in this, the root namespace)
        lab.shape(1, rate_mbit=200)        # both directions of node 1's link limited to 200 Mbit/s
        lab.unshape(1)
        lab.exec_argv(1, ["python3", "x.py"])   # argv that runs x.py inside node 1's namespace
        lab.run(1, ["ip", "addr"])         # the same, run, output captured
        lab.counters(1)                    # LinkCounters(rx_bytes, tx_bytes, ...) as seen by the node
        lab.mpirun_argv([1, 2], 1, ["python3", "x.py"], agent_dir=tmp)  # one rank per node

`Lab(...)` builds nothing until entered (or `up()` is called); entering first removes what a
lab with the same prefix left behind (a crashed run), and leaving removes the namespaces, the
veth pairs and the bridge even when the body raised. Only addresses inside the lab's own
namespaces and the bridge are used; pick another `subnet`/`prefix` where these are taken.

Link and rate. Each node has one veth pair: `node_dev` inside the namespace (its NIC) and
`host_dev` enslaved to the bridge (its switch port). `shape(node, rate_mbit)` puts an HTB
qdisc on the egress of both ends, so the node sends at most `rate_mbit` and receives at most
`rate_mbit`, like a full-duplex NIC of that speed behind a switch that is never the limit.
The rate counts the bytes of whole Ethernet frames as the kernel hands them to the qdisc
(IP packet + 14-byte Ethernet header; no preamble, FCS or inter-frame gap). A TCP stream at
MTU 1500 with timestamps carries 1448 payload bytes per 1514-byte frame, so its goodput is at
most `rate × 1448/1514` (`TCP_PAYLOAD_FRACTION`, 95.6 %). Small packets (IP length < 128
bytes: TCP ACKs, MPI and Slurm control messages) go in a priority class of the same rate:
with one FIFO they wait behind a full data queue in the reverse direction and every sender
stalls on its acknowledgements (an all-reduce then reaches only 50-60 % of the rate).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import stat
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from hpcbench.errors import HpcbenchError

# TCP payload per Ethernet frame at MTU 1500 with TCP timestamps: 1500 - 20 (IP) - 32 (TCP).
TCP_PAYLOAD_FRACTION = 1448 / 1514
_IFNAME_MAX = 15  # Linux interface names


class LabError(HpcbenchError):
    """The lab could not be built, changed or torn down."""


@dataclass(frozen=True)
class Node:
    """One virtual node of the lab."""

    index: int  # 1-based
    namespace: str  # network namespace name (/run/netns/<namespace>)
    address: str  # IPv4 address inside the namespace, on the lab's subnet
    node_dev: str  # the veth end inside the namespace
    host_dev: str  # the veth end in the root namespace, on the bridge

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.namespace}"


@dataclass(frozen=True)
class LinkCounters:
    """Byte and packet counters of a node's link, seen from the node."""

    rx_bytes: int
    tx_bytes: int
    rx_packets: int
    tx_packets: int


@dataclass(frozen=True)
class Shaping:
    """What `Lab.shape` set on a node's link."""

    rate_mbit: float
    burst_kbit: int
    queue_packets: int

    @property
    def rate_bytes_per_s(self) -> float:
        """The configured rate in frame bytes per second."""
        return self.rate_mbit * 1e6 / 8

    @property
    def tcp_goodput_bytes_per_s(self) -> float:
        """The most TCP payload bytes per second the link can carry one way."""
        return self.rate_bytes_per_s * TCP_PAYLOAD_FRACTION


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise LabError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")
    return proc


def _tc(namespace: str | None, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["tc", *args] if namespace is None else ["ip", "netns", "exec", namespace, "tc", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise LabError(f"`{' '.join(argv)}` failed: {proc.stderr.strip()}")
    return proc


class Lab:
    """`nodes` namespaces `<prefix>1..<prefix>N` on bridge `<prefix>br` (see the module doc)."""

    def __init__(self, nodes: int, subnet: str = "10.231.0.0/24", prefix: str = "hbn") -> None:
        if not isinstance(nodes, int) or nodes < 1:
            raise LabError(f"nodes: must be a positive integer, got {nodes!r}")
        if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", prefix):
            raise LabError(f"prefix: must be 1-8 lower-case letters or digits starting with a letter, got {prefix!r}")
        try:
            net = ipaddress.IPv4Network(subnet)
        except ValueError as exc:
            raise LabError(f"subnet: not an IPv4 network ({exc}), e.g. 10.231.0.0/24") from None
        if net.num_addresses < nodes + 3:
            raise LabError(f"subnet: {subnet} has room for fewer than {nodes} nodes and a bridge")
        self.prefix = prefix
        self.subnet = net
        self.bridge = f"{prefix}br"
        self.bridge_address = str(net.network_address + 1)
        self.nodes = [
            Node(i, f"{prefix}{i}", str(net.network_address + 1 + i), f"{prefix}{i}n", f"{prefix}{i}h")
            for i in range(1, nodes + 1)
        ]
        if len(self.nodes[-1].host_dev) > _IFNAME_MAX:
            raise LabError(f"prefix: {prefix!r} with {nodes} nodes makes interface names over 15 characters")
        self.shaping: dict[int, Shaping] = {}
        self._up = False

    # -------------------------------------------------------------- build ---
    def __enter__(self) -> Lab:
        self.up()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.down()

    def up(self) -> None:
        """Remove a stale lab of this prefix, then build this one (torn down again on failure)."""
        if os.geteuid() != 0:
            raise LabError("the network lab needs root (network namespaces, veth pairs, tc)")
        self.cleanup_stale()
        try:
            _ip("link", "add", self.bridge, "type", "bridge", "forward_delay", "0", "stp_state", "0")
            _ip("addr", "add", f"{self.bridge_address}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for node in self.nodes:
                self._add_node(node)
            self._wait_ready()
        except BaseException:
            self.down()
            raise
        self._up = True

    def _add_node(self, node: Node) -> None:
        ns = node.namespace
        _ip("netns", "add", ns)
        _ip("link", "add", node.host_dev, "type", "veth", "peer", "name", node.node_dev)
        _ip("link", "set", node.node_dev, "netns", ns)
        _ip("link", "set", node.host_dev, "master", self.bridge)
        _ip("link", "set", node.host_dev, "up")
        _ip("-n", ns, "addr", "add", f"{node.address}/{self.subnet.prefixlen}", "dev", node.node_dev)
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "link", "set", node.node_dev, "up")
        _ip("-n", ns, "route", "add", "default", "via", self.bridge_address)

    def _wait_ready(self, timeout: float = 10) -> None:
        """Until every link is up at both ends and its bridge port forwards."""
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            port = Path("/sys/class/net") / node.host_dev
            while True:
                inner = json.loads(_ip("-n", node.namespace, "-j", "link", "show", node.node_dev).stdout)
                ready = (
                    inner[0].get("operstate") == "UP"
                    and (port / "operstate").read_text().strip() == "up"
                    and (port / "brport" / "state").read_text().strip() == "3"  # BR_STATE_FORWARDING
                )
                if ready:
                    break
                if time.monotonic() > deadline:
                    raise LabError(f"node {node.index}: link {node.host_dev} not up and forwarding after {timeout} s")
                time.sleep(0.05)

    def down(self) -> None:
        """Remove every namespace, veth pair and the bridge of this lab; safe to call twice."""
        self._up = False
        self.shaping.clear()
        self.cleanup_stale()

    def cleanup_stale(self) -> None:
        """Delete what any lab with this prefix made: `<prefix><digits>` namespaces, their
        host-side veths and the bridge. Nothing else is touched."""
        names = re.compile(rf"{re.escape(self.prefix)}\d+")
        listed = _ip("netns", "list", check=False).stdout.split("\n")
        for ns in (line.split()[0] for line in listed if line.strip()):
            if names.fullmatch(ns):
                _ip("netns", "delete", ns, check=False)
        links = json.loads(_ip("-j", "link", "show", check=False).stdout or "[]")
        devs = re.compile(rf"{re.escape(self.prefix)}(\d+h|br)")
        for link in links:
            name = str(link.get("ifname", ""))
            if devs.fullmatch(name):
                _ip("link", "delete", name, check=False)

    # -------------------------------------------------------------- nodes ---
    def node(self, index: int) -> Node:
        if not 1 <= index <= len(self.nodes):
            raise LabError(f"node: {index} is not a node of this lab (1..{len(self.nodes)})")
        return self.nodes[index - 1]

    def exec_argv(self, node: int, argv: Sequence[str | Path]) -> list[str]:
        """`argv` run inside the node's network namespace (nsenter: /sys stays as it is, which
        slurmd needs; `ip netns exec` would remount it)."""
        return ["nsenter", f"--net={self.node(node).netns_path}", "--", *map(str, argv)]

    def run(
        self, node: int, argv: Sequence[str | Path], timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(self.exec_argv(node, argv), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise LabError(f"on node {node}: `{' '.join(map(str, argv))}` failed: {proc.stderr.strip()[-500:]}")
        return proc

    def counters(self, node: int) -> LinkCounters:
        """The node's link counters from the host-side veth (what it sends arrives there)."""
        base = Path("/sys/class/net") / self.node(node).host_dev / "statistics"

        def read(name: str) -> int:
            return int((base / name).read_text())

        # The host end's rx is the node's tx and the other way round.
        return LinkCounters(read("tx_bytes"), read("rx_bytes"), read("tx_packets"), read("rx_packets"))

    # ------------------------------------------------------------ shaping ---
    def shape(
        self,
        node: int,
        rate_mbit: float,
        *,
        burst_kbit: int = 1000,
        queue_packets: int = 1000,
        direction: str = "both",
    ) -> Shaping:
        """Limit node's link to `rate_mbit` (frame bytes, see the module doc): `direction`
        "out" (what the node sends), "in" (what it receives) or "both"."""
        if not rate_mbit > 0:
            raise LabError(f"rate_mbit: must be > 0, got {rate_mbit!r}")
        if direction not in ("in", "out", "both"):
            raise LabError(f"direction: must be 'in', 'out' or 'both', got {direction!r}")
        self.unshape(node)
        n = self.node(node)
        if direction in ("out", "both"):
            self._htb(n.namespace, n.node_dev, rate_mbit, burst_kbit, queue_packets)
        if direction in ("in", "both"):
            self._htb(None, n.host_dev, rate_mbit, burst_kbit, queue_packets)
        shaping = Shaping(rate_mbit, burst_kbit, queue_packets)
        self.shaping[node] = shaping
        return shaping

    @staticmethod
    def _htb(namespace: str | None, dev: str, rate_mbit: float, burst_kbit: int, queue: int) -> None:
        rate = f"{rate_mbit * 1000:.0f}kbit"
        small = f"{rate_mbit * 100:.0f}kbit"  # guaranteed to the small packets; both may use all
        bulk = f"{rate_mbit * 900:.0f}kbit"
        burst = f"burst {burst_kbit}kbit cburst {burst_kbit}kbit"
        for command in (
            f"qdisc add dev {dev} root handle 1: htb default 20 r2q 100",
            f"class add dev {dev} parent 1: classid 1:1 htb rate {rate} ceil {rate} {burst}",
            f"class add dev {dev} parent 1:1 classid 1:10 htb rate {small} ceil {rate} prio 0 {burst}",
            f"class add dev {dev} parent 1:1 classid 1:20 htb rate {bulk} ceil {rate} prio 1 {burst}",
            f"qdisc add dev {dev} parent 1:20 handle 20: pfifo limit {queue}",
            # IP total length < 128 bytes (the top 9 bits of the 16-bit field at offset 2 are 0).
            f"filter add dev {dev} parent 1: protocol ip prio 1 u32 match u16 0x0000 0xff80 at 2 flowid 1:10",
        ):
            _tc(namespace, *command.split())

    def unshape(self, node: int) -> None:
        """Remove any rate limit from the node's link (both directions)."""
        n = self.node(node)
        _tc(n.namespace, "qdisc", "del", "dev", n.node_dev, "root", check=False)
        _tc(None, "qdisc", "del", "dev", n.host_dev, "root", check=False)
        self.shaping.pop(node, None)

    # -------------------------------------------------------------- mpirun ---
    def rsh_agent(self, directory: Path) -> Path:
        """A script mpirun can use instead of ssh: `AGENT NAMESPACE CMD...` runs CMD in that
        namespace (the host names mpirun is given are the namespace names)."""
        agent = directory / f"{self.prefix}-rsh.sh"
        agent.write_text(
            "#!/bin/sh\n# mpirun's remote shell for the network lab: host = namespace, and the\n"
            "# namespace's name is the host name there (else every daemon says it runs on this host).\n"
            'ns=$1; shift\nexec nsenter --net=/run/netns/"$ns" -- unshare --uts -- /bin/sh -c "hostname $ns; $*"\n'
        )
        agent.chmod(agent.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return agent

    def mpirun_argv(
        self, nodes: Sequence[int], ranks_per_node: int, argv: Sequence[str | Path], agent_dir: Path
    ) -> list[str]:
        """`mpirun` (started in the root namespace) placing `ranks_per_node` ranks in each of
        `nodes`' namespaces, talking TCP over the lab's subnet only (run with MPI_ENV)."""
        hosts = ",".join(f"{self.node(i).namespace}:{ranks_per_node}" for i in nodes)
        subnet = str(self.subnet)
        return [
            "mpirun", "-n", str(ranks_per_node * len(nodes)), "--host", hosts, "--bind-to", "none",
            "--mca", "plm_rsh_agent", str(self.rsh_agent(agent_dir)),
            "--mca", "btl", "self,tcp",
            "--mca", "oob_tcp_if_include", subnet, "--mca", "btl_tcp_if_include", subnet,
            *map(str, argv),
        ]  # fmt: skip
