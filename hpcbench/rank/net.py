"""Processes and ports between peers: the TCP port a rank picks for a rendezvous and tells
its peers, and the tie of a child process to its parent's life."""

from __future__ import annotations

import ctypes
import signal
import socket
import sys

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def die_with_parent() -> None:
    """For `preexec_fn`, in the child before exec: SIGTERM when the parent dies, even by
    SIGKILL (Linux's PR_SET_PDEATHSIG), so nothing runs on orphaned: a launcher stops its
    ranks, a parameter server its serving. Async-signal-safe: one prctl call."""
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    """A TCP port free on this host now (the OS picks it; the server binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port: int = s.getsockname()[1]
        return port
