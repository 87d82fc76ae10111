"""Plain-text tables for terminals and logs."""

from __future__ import annotations

from collections.abc import Sequence


def render(rows: Sequence[Sequence[str]], right: bool = False, indent: str = "") -> str:
    """Columns padded to their widest cell; the first row is the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    pad = str.rjust if right else str.ljust
    return "\n".join(indent + "  ".join(pad(c, w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)
