"""How every command reports a bad input or a failure it can explain (an HpcbenchError): one
line on stderr, `PROG: error: ...`, the traceback too with `-v`, and an exit status.

Exit statuses (docs/running.md#outputs-and-exit-codes): 0 success; 1 results that show a
problem (a failed point, a regression), which a command returns, never raises; 2 bad input
of any kind (arguments, missing, unreadable or damaged files, an output that may not or
cannot be written). `guarded` runs a command under that policy: whatever it raises comes
out as one line and exit 2, a traceback only with `-v`.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

from hpcbench.errors import HpcbenchError, one_line

OK = 0
PROBLEM = 1  # the results show a problem: a failed point, a regression
BAD_INPUT = 2  # the command could not do what it was asked: arguments, inputs, outputs


def _line(prog: str, text: str) -> None:
    print(f"{prog}: error: {one_line(text)}", file=sys.stderr)  # one line, whatever the value held


def report(exc: HpcbenchError, prog: str, verbose: bool = False, exit_code: int | None = None) -> int:
    """Print `exc` as one line; its exit code (`exc.exit_code` unless `exit_code` is given)."""
    if verbose:
        traceback.print_exc()
    _line(prog, str(exc))
    return exc.exit_code if exit_code is None else exit_code


def _os_error(exc: OSError) -> str:
    where = exc.filename if exc.filename is not None else ""
    why = exc.strerror or type(exc).__name__
    return f"{where}: {why}" if where != "" else why


def guarded(command: Callable[[], int], prog: str, verbose: bool = False) -> int:
    """Run `command()` (it returns 0 or PROBLEM) and turn what it raises into one line and
    exit BAD_INPUT: an HpcbenchError as its message, an OSError with its path and reason,
    anything else (a fault of hpcbench's on input it did not foresee) named as such.
    A closed stdout (BrokenPipeError) and Ctrl-C go on to the caller."""
    try:
        return command()
    except (BrokenPipeError, KeyboardInterrupt):
        raise
    except HpcbenchError as exc:
        return report(exc, prog, verbose, exit_code=BAD_INPUT)
    except OSError as exc:
        if verbose:
            traceback.print_exc()
        _line(prog, _os_error(exc))
        return BAD_INPUT
    except Exception as exc:  # noqa: BLE001 - the last guard: no traceback without -v, whatever the input
        if verbose:
            traceback.print_exc()
        _line(prog, f"unexpected {type(exc).__name__}: {exc} (an hpcbench fault on this input; -v shows where)")
        return BAD_INPUT
