"""Launchers, one module each, found by name through `LAUNCHERS`."""

from hpcbench.launchers.base import LAUNCHERS, LaunchContext, Launcher, Tasks, detect

__all__ = ["LAUNCHERS", "LaunchContext", "Launcher", "Tasks", "detect"]
