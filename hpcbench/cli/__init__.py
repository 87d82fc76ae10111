"""The `hpcbench` command and its subcommands (main.py); each subcommand family in its own
module: sweep.py (run, status, resume, cancel, check), analyze.py (analyze, report,
trace)."""
