"""Framework adapters, one module each, found by name through `FRAMEWORKS`."""

from hpcbench.frameworks.base import FRAMEWORKS, Framework

__all__ = ["FRAMEWORKS", "Framework"]
