"""Plain-text tables for terminals and logs, laid out by rich (docs/libraries.md says why rich).

The table is rendered without borders or colour into a string, so the same text goes to a
terminal, a log file or a pipe, and callers print it where their other output goes.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text


def render(rows: Sequence[Sequence[str]], right: bool = False, indent: str = "") -> str:
    """Columns padded to their widest cell, two spaces apart; the first row is the header.
    Cells are text, never markup: "[x]" stays "[x]"."""
    table = Table(box=None, header_style=None, pad_edge=False, show_edge=False)
    for header in rows[0]:
        table.add_column(Text(header), justify="right" if right else "left", no_wrap=True)
    for row in rows[1:]:
        table.add_row(*(Text(cell) for cell in row))
    buffer = io.StringIO()
    # wide enough that no column is ever cut or wrapped; no colour, no terminal codes
    Console(file=buffer, width=1 << 16, color_system=None, force_terminal=False, highlight=False).print(table)
    return "\n".join(indent + line.rstrip() for line in buffer.getvalue().splitlines())
