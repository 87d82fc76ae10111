"""The run file: everything a worker needs to run one point, written by the sweep.

`SWEEP_DIR/points/<id>.json` is the single argument of `python -m hpcbench.worker`, so
launch commands carry no user text but this one path.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcbench.spec import Options, Point
from hpcbench.sweepdir.atomic import write_text_atomic
from hpcbench.sweepdir.layout import SweepDir


@dataclass(frozen=True)
class RunFile:
    point: Point
    sweep: str  # the sweep's name
    spec_text: str  # the spec as written
    options: Options
    profile: dict[str, Any] = field(default_factory=dict)  # the site profile, as recorded

    def write(self, sweep_dir: Path) -> Path:
        path = SweepDir(sweep_dir).run_file(self.point.id)
        data = {
            "point": self.point.as_dict(),
            "sweep": self.sweep,
            "spec_text": self.spec_text,
            "options": dataclasses.asdict(self.options),
            "profile": self.profile,
        }
        write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True))
        return path

    @classmethod
    def load(cls, path: Path) -> RunFile:
        data = json.loads(path.read_text())
        options = Options(**data["options"])
        return cls(Point.from_dict(data["point"]), data["sweep"], data["spec_text"], options, data.get("profile", {}))
