"""`python -m hpcbench.commbench`: kept entry point of the collective micro-benchmark
(`hpcbench commbench`; hpcbench.cli.commbench)."""

import sys

from hpcbench.cli.commbench import main

if __name__ == "__main__":
    sys.exit(main())
