"""How every command reports a bad input or a failure it can explain (an HpcbenchError): one
line on stderr, `PROG: error: ...`, the traceback too with `-v`, and the error's exit code."""

from __future__ import annotations

import sys
import traceback

from hpcbench.errors import HpcbenchError, one_line


def report(exc: HpcbenchError, prog: str, verbose: bool = False) -> int:
    if verbose:
        traceback.print_exc()
    print(f"{prog}: error: {one_line(str(exc))}", file=sys.stderr)  # one line, whatever the value held
    return exc.exit_code
