"""The HTML report: figures, tables and the straggler section."""
