"""Live progress of long commands: a rich progress bar on a terminal, plain lines elsewhere.

On a terminal the bar stays at the bottom while the command's own lines (a point done, a
point failed) scroll above it. When the output is a file or a pipe (logs, CI), a plain line
is printed each time the state changes, and nothing else: no control codes in a log.

    with SweepProgress(out, total) as (stream, progress):
        ...                          # print to `stream`, not `out`, while the bar is shown
        progress.update(counts)      # {state: number of points}, the manifest's counts
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from hpcbench.sweepdir.manifest import ENDED


def plain_line(counts: dict[str, int], width: int = 30) -> str:
    """`[#####.....] 3/10 finished (2 done, 1 failed, 7 queued)`."""
    total = sum(counts.values()) or 1
    finished = sum(counts.get(s, 0) for s in ENDED)
    filled = width * finished // total
    states = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    return f"[{'#' * filled}{'.' * (width - filled)}] {finished}/{total} finished ({states})"


def _is_terminal(out: TextIO) -> bool:
    isatty = getattr(out, "isatty", None)
    return bool(isatty and isatty())


class SweepProgress:
    """Points finished out of `total`, with every state's count beside the bar."""

    def __init__(self, out: TextIO, total: int, label: str = "points", plain: bool = True) -> None:
        """`plain`: print a line on each change when `out` is not a terminal (else nothing)."""
        self.out, self.total, self.label, self.plain = out, total, label, plain
        self.live = _is_terminal(out)
        self._last = ""
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> tuple[TextIO, SweepProgress]:
        if not self.live:
            return self.out, self
        self._bar = Progress(
            TextColumn(self.label),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[states]}"),
            TimeElapsedColumn(),
            console=Console(file=self.out),
            redirect_stdout=True,
            redirect_stderr=True,
        )
        self._bar.start()
        self._task = self._bar.add_task(self.label, total=self.total, states="")
        # While the bar is live, lines printed through sys.stdout scroll above it.
        return sys.stdout, self

    def update(self, counts: dict[str, int]) -> None:
        line = plain_line(counts)
        if line == self._last:
            return
        self._last = line
        if self._bar is None or self._task is None:
            if self.plain:
                print(line, file=self.out, flush=True)
            return
        states = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        finished = sum(counts.get(s, 0) for s in ENDED)
        self._bar.update(self._task, completed=finished, states=states)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()


class FileProgress:
    """Point files read while a sweep is analysed: a bar on stderr when it is a terminal,
    nothing otherwise (the analysis' own output is what a log needs).

        with FileProgress() as tick:
            pipeline.analyse(directory, on_file=tick)
    """

    def __init__(self, err: TextIO | None = None) -> None:
        self.err = err if err is not None else sys.stderr
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> Callable[[int, int], None]:
        if _is_terminal(self.err):
            self._bar = Progress(
                TextColumn("reading point files"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=Console(file=self.err), transient=True,
            )  # fmt: skip
            self._bar.start()
        return self.tick

    def tick(self, done: int, total: int) -> None:
        if self._bar is None:
            return
        if self._task is None:
            self._task = self._bar.add_task("read", total=total)
        self._bar.update(self._task, completed=done, total=total)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()


class Poller:
    """Calls `tick` every `interval` seconds on a thread until stopped (and once more at the end)."""

    def __init__(self, tick: Callable[[], None], interval: float = 0.5) -> None:
        self.tick, self.interval = tick, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpcbench-progress", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.tick()

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self.tick()
