"""A sweep directory and everything in it: the layout and names (layout.py), the manifest of
points and their states (manifest.py), run files (runfile.py), the sweep lock (lock.py),
atomic writes (atomic.py) and path checks (paths.py)."""
