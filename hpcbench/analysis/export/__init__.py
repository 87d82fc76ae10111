"""`hpcbench export`: a sweep's point files as Parquet tables, MLPerf-style logs and a JSON
summary, for other tools (docs/export.md).

- columns.py: numpy arrays to Arrow columns (times as int64 ns, dictionary strings, nulls)
- schemas.py: every exported column (type, unit, meaning, encoding) and a point's rows
- parquet.py: the Parquet files, written point by point
- summary.py: summary.json, the analysis' stats table
- mllog.py: `:::MLLOG` lines per point
- output.py: the output folder (staging, no overwrite)
- sweep.py: the whole export (`export_sweep`)
"""

from __future__ import annotations

from hpcbench.analysis.export.sweep import FORMATS, Exported, export_sweep, parse_formats

__all__ = ["FORMATS", "Exported", "export_sweep", "parse_formats"]
