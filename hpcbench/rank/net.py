"""TCP ports for rendezvous: what a rank on one host picks and tells its peers."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on this host now (the OS picks it; the server binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port: int = s.getsockname()[1]
        return port
