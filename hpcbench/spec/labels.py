"""Labels that tell points apart, wherever several are shown together (`run`, `status`,
`compare`, the report).

`Point.label()` names the fields most sweeps vary (framework, backend, model, nodes x ranks
per node, batch size). Points that differ only in a field it leaves out (`extra`, `launcher`,
`env`, `seed`, ...) would get the same label; `labels` adds, to the points whose shown label is
shared, the fields that differ among them (a mapping field key by key: `extra.servers=2`), and
nothing to a point whose label is its own. The rule, per group of points with one shown label:
every field (or mapping key) whose values are not all equal within the group is named, in the
order of the Point's fields, as `name=value` (`unset` where a point does not set it).

Ground floor, like the rest of hpcbench.spec; the ranks import it (Python 3.9).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from hpcbench.spec.point import Point

UNSET = "unset"  # a field (or mapping key) a point does not set, beside points that do
_FIELD_ORDER = tuple(f.name for f in dataclasses.fields(Point))


def _flat(name: str, value: Any) -> Iterable[tuple[str, Any]]:
    """(name, value) pairs of a field: a mapping key by key (`extra.servers`), nested too."""
    if isinstance(value, Mapping):
        for key in sorted(value, key=str):
            yield from _flat(f"{name}.{key}", value[key])
    else:
        yield name, value


def fields_of(point: Point) -> dict[str, Any]:
    """The point's fields flattened: mappings key by key, an empty mapping as nothing."""
    out: dict[str, Any] = {}
    for name, value in point.as_dict().items():
        out.update(_flat(name, value))
    return out


def show_value(value: Any) -> str:
    """A field value as a label shows it: text as it is (quoted only where it would be
    misread), numbers plainly, booleans as true/false, unset as `unset`."""
    if value is None:
        return UNSET
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):
        plain = value and value == value.strip() and " " not in value and value != UNSET and "=" not in value
        return value if plain else json.dumps(value)
    if isinstance(value, (int,)):
        return str(value)
    return json.dumps(value, sort_keys=True)


def _order(name: str) -> tuple[int, str]:
    head = name.split(".", 1)[0]
    return (_FIELD_ORDER.index(head) if head in _FIELD_ORDER else len(_FIELD_ORDER), name)


def differing(
    points: Iterable[Point], shown: Callable[[Point], Hashable] = Point.label, ignore: Iterable[str] = ()
) -> dict[str, str]:
    """For each point id, what tells it apart from the points whose `shown` label it shares:
    `name=value` of every field (mapping key) that differs among them, '' where its shown
    label is its own. Fields named in `ignore` are never named (a figure's x axis, say)."""
    left_out = set(ignore)
    groups: dict[Hashable, dict[str, Point]] = {}
    for p in points:
        groups.setdefault(shown(p), {})[p.id] = p
    out: dict[str, str] = {}
    for group in groups.values():
        if len(group) == 1:
            out.update(dict.fromkeys(group, ""))
            continue
        flat = {pid: fields_of(p) for pid, p in group.items()}
        names = sorted({name for values in flat.values() for name in values}, key=_order)
        varying = [
            name
            for name in names
            if name.split(".", 1)[0] not in left_out
            and len({json.dumps(values.get(name), sort_keys=True) for values in flat.values()}) > 1
        ]
        for pid, values in flat.items():
            out[pid] = " ".join(f"{name}={show_value(values.get(name))}" for name in varying)
    return out


def labels(points: Iterable[Point]) -> dict[str, str]:
    """A label per point id that tells it apart from the others: `Point.label()`, then the
    fields that differ among the points sharing that label (`differing`)."""
    points = list(points)
    extra = differing(points)
    return {p.id: f"{p.label()} {extra[p.id]}".rstrip() for p in points}
