"""The report page's notes grouped by kind: one line per kind naming its points, the notes
themselves in a table under it, instead of one line per point and kind.

A note about one point or configuration reads `point ID: detail` or `configuration ID:
detail` (analysis/stats.py, resources.py); notes whose details differ only in their numbers
and in the id itself are of one kind. Other notes (files skipped, MFU's peak) are their own kind.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

SUBJECT = re.compile(r"^(point|configuration) (\S+): (.+)$", re.S)
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


@dataclass
class Kind:
    """Notes of one kind: what they say (numbers that differ among them shown as …) and each
    note's subject and full text."""

    what: str  # `point` or `configuration`, '' for a note about neither
    parts: list[str]  # the text between the numbers
    numbers: list[set[str]]  # each slot's values across the notes
    notes: list[tuple[str, str]] = field(default_factory=list)  # (subject id, full text)

    def summary(self) -> str:
        out = [self.parts[0]]
        for values, part in zip(self.numbers, self.parts[1:], strict=True):
            out += [next(iter(values)) if len(values) == 1 else "…", part]
        return "".join(out)


def grouped(notes: list[str]) -> list[Kind]:
    """`notes` by kind, in the order each kind first appears."""
    kinds: dict[tuple[str, ...], Kind] = {}
    for note in notes:
        found = SUBJECT.match(note)
        what, subject, detail = found.groups() if found else ("", "", note)
        template = detail.replace(subject, "ID") if subject else detail
        parts, numbers = NUMBER.split(template), NUMBER.findall(template)
        key = (what, *parts)
        kind = kinds.setdefault(key, Kind(what, parts, [set() for _ in numbers]))
        for values, number in zip(kind.numbers, numbers, strict=True):
            values.add(number)
        kind.notes.append((subject, note))
    return list(kinds.values())


def render(notes: list[str]) -> list[str]:
    """The notes' HTML: a list, one line per kind; where a kind has several notes or names a
    subject, its points and a collapsible table of the notes."""
    out = ['<ul class="notes">']
    for kind in grouped(notes):
        if not kind.what:
            out += [f'<li class="note">{html.escape(text)}</li>' for _, text in kind.notes]
            continue
        subjects = [s for s, _ in kind.notes]
        plural = f"{len(subjects)} {kind.what}s" if len(subjects) > 1 else f"{kind.what}"
        named = ", ".join(subjects)
        rows = "".join(
            f"<tr><td>{html.escape(s)}</td><td>{html.escape(t)}</td></tr>" for s, t in kind.notes
        )  # fmt: skip
        out.append(
            f'<li class="note" data-kind-count="{len(subjects)}">{html.escape(plural)} ({html.escape(named)}): '
            f"{html.escape(kind.summary())}<details><summary>each {html.escape(kind.what)}</summary>"
            f"<table><thead><tr><th>{html.escape(kind.what)}</th><th>note</th></tr></thead><tbody>{rows}"
            "</tbody></table></details></li>"
        )
    out.append("</ul>")
    return out
