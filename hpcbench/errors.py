"""The one exception family hpcbench raises for problems a user can fix."""

from __future__ import annotations


def one_line(text: str) -> str:
    """`text` with control characters escaped (\\n, \\x1b, ...), so a message stays on one line
    and cannot move the cursor or recolour a terminal, whatever a user put in a value."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class HpcbenchError(Exception):
    """A problem with a clear next step. The CLIs print its message on one line and exit with
    `exit_code`: 2, bad input of any kind (arguments, files, an output that may not be written,
    a command that cannot do what it was asked; docs/running.md#outputs-and-exit-codes). Results
    that show a problem (a failed point, a regression) are no error: a command returns 1 for
    them; a subclass that stands for one says so with its own `exit_code = 1`."""

    exit_code = 2


class SpecError(HpcbenchError):
    """An invalid sweep spec: names the field path, the bad value and what is allowed."""

    def __init__(self, path: str, problem: str, allowed: str | None = None) -> None:
        self.path = path
        self.problem = problem
        self.allowed = allowed
        message = f"{path}: {problem}" if path else problem
        if allowed:
            message += f" (allowed: {allowed})"
        super().__init__(one_line(message))


class SchemaError(HpcbenchError):
    """A point file that this version of hpcbench cannot read."""


class LaunchError(HpcbenchError):
    """A point that cannot be launched as asked (missing launcher, unsupported combination)."""
