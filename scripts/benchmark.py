"""`python scripts/benchmark.py`, the same program as `vit-benchmark` (see --help)."""

import sys

from vit.commands.benchmark import main

if __name__ == "__main__":
    sys.exit(main())
