"""A command whose reader goes away (`hpcbench analyze DIR | head`) ends quietly, as `cat`
does, instead of printing a BrokenPipeError traceback."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import ParamSpec

P = ParamSpec("P")
EXIT_SIGPIPE = 128 + 13


def quiet_on_closed_pipe(main: Callable[P, int]) -> Callable[P, int]:
    @functools.wraps(main)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except BrokenPipeError:
            # Python flushes stdout again at exit: point it at /dev/null so that fails quietly too.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_SIGPIPE

    return wrapper
