"""Live progress: plain lines, only on change, when the output is not a terminal; a rich bar on
a real terminal (a pseudo-terminal here), with the command's own lines scrolling above it."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hpcbench.cli.progress import Poller, SweepProgress, plain_line
from hpcbench.cli.textable import render
from tests.conftest import ROOT, run_module, spec_text


def test_plain_lines_only_when_the_counts_change() -> None:
    out = io.StringIO()
    with SweepProgress(out, 4) as (stream, progress):
        assert stream is out  # not a terminal: nothing is redirected
        progress.update({"running": 2, "queued": 2})
        progress.update({"running": 2, "queued": 2})  # the same: no new line
        progress.update({"done": 3, "failed": 1})
    lines = out.getvalue().splitlines()
    assert lines == [
        "[..............................] 0/4 finished (2 running, 2 queued)",
        "[##############################] 4/4 finished (3 done, 1 failed)",
    ]
    assert "\x1b" not in out.getvalue()  # no control codes in a log


def test_stopped_points_count_as_finished() -> None:
    assert (
        plain_line({"done": 1, "stopped": 1, "queued": 2}, width=4)
        == "[##..] 2/4 finished (1 done, 1 stopped, 2 queued)"
    )


def test_poller_ticks_while_running_and_once_at_the_end() -> None:
    ticks: list[str] = []  # the thread of each tick
    with Poller(lambda: ticks.append(threading.current_thread().name), interval=0.01) as poller:
        deadline = time.monotonic() + 30
        while len(ticks) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert ticks.count(poller._thread.name) >= 3  # it ticked while running (on its own thread)
    assert ticks[-1] == threading.current_thread().name  # the final tick, here, once the thread stopped
    assert ticks.count(threading.current_thread().name) == 1
    assert not poller._thread.is_alive()


def on_a_terminal(argv: list[str], timeout: float = 300) -> str:
    """What `argv` writes to a real (pseudo-)terminal of 100 columns; asserts it exits 0."""
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "100", "LINES": "30", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, cwd=ROOT, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    screen = b"".join(chunks).decode(errors="replace")
    assert proc.wait(timeout=timeout) == 0, screen[-3000:]
    return screen


def test_a_terminal_gets_a_live_bar_with_lines_above_it() -> None:
    script = textwrap.dedent(
        """
        import sys
        from hpcbench.cli.progress import SweepProgress
        with SweepProgress(sys.stdout, 4) as (stream, progress):
            progress.update({"running": 1, "queued": 3})
            print("  point-a  done", file=stream, flush=True)
            progress.update({"done": 3, "failed": 1})
        """
    )
    screen = on_a_terminal([sys.executable, "-c", script])
    assert "\x1b[" in screen  # a live display: cursor and colour codes
    assert "4/4" in screen and "3 done, 1 failed" in screen  # the bar's last state
    assert "point-a  done" in screen  # the command's own line, printed while the bar was live


def test_a_local_sweep_shows_its_progress_on_a_terminal_only(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    spec = write_spec(
        spec_text("bar", {"seed": [1, 2]}, framework="synthetic", backend="none", model="sleep", iterations=3)
    )
    screen = on_a_terminal([sys.executable, "-m", "hpcbench", "run", str(spec), "--out", str(tmp_path / "t")])
    assert "2/2" in screen and "2 done" in screen  # the bar, at its end
    assert screen.count("  done  ") == 2  # each point's own line
    logged = run_module("hpcbench", "run", str(spec), "--out", str(tmp_path / "l"))
    assert logged.returncode == 0, logged.stderr
    assert "\x1b" not in logged.stdout and "finished (" not in logged.stdout  # a log: the points' lines only
    assert logged.stdout.count("  done  ") == 2


def test_tables_are_plain_aligned_text() -> None:
    text = render([("point", "state"), ("a1", "[done]"), ("b22", "failed")], indent="  ")
    assert text.splitlines() == ["  point  state", "  a1     [done]", "  b22    failed"]
