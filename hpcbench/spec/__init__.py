"""Sweep specs and points: the ground floor of hpcbench (imports nothing of it but errors).

point.py holds `Point` and its stable id, fields.py the checkers of every field, sweep.py
the YAML loading and expansion into a `Sweep`, labels.py the labels that tell points apart.
"""

from hpcbench.spec.fields import DEVICES, OPTIMIZERS, WRITERS, Choices, OptionsParser, environ_items
from hpcbench.spec.labels import differing, labels
from hpcbench.spec.point import DEFAULTS, FIELD_NAMES, SYNONYMS, Point, Scalar, point_id
from hpcbench.spec.sweep import Options, PointCheck, Sweep, load_sweep, parse_yaml

__all__ = [
    "DEFAULTS",
    "DEVICES",
    "FIELD_NAMES",
    "OPTIMIZERS",
    "SYNONYMS",
    "WRITERS",
    "Choices",
    "Options",
    "OptionsParser",
    "Point",
    "PointCheck",
    "Scalar",
    "Sweep",
    "differing",
    "environ_items",
    "labels",
    "load_sweep",
    "parse_yaml",
    "point_id",
]
