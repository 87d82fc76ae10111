"""`python -m hpcbench.analyze`: kept entry point; the same commands as `hpcbench` (hpcbench.cli.analyze)."""

import sys

from hpcbench.cli.analyze import main

if __name__ == "__main__":
    sys.exit(main())
