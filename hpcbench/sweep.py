"""`python -m hpcbench.sweep`: kept entry point; the same commands as `hpcbench` (hpcbench.cli.sweep)."""

import sys

from hpcbench.cli.sweep import main

if __name__ == "__main__":
    sys.exit(main())
