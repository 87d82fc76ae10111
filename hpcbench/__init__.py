"""hpcbench: reproducible benchmarks of distributed deep-learning training on HPC clusters.

The flow is one way: sweep spec -> points -> jobs -> ranks -> one HDF5 file per point ->
analysis. See README.md for the commands and the HDF5 layout.
"""

__version__ = "0.9.0"
