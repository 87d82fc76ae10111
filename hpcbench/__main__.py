"""`python -m hpcbench`: the `hpcbench` command (hpcbench.cli.main)."""

import sys

from hpcbench.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
