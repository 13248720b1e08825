"""`python scripts/demo.py`, the same program as `vit-demo` (see --help)."""

import sys

from vit.commands.demo import main

if __name__ == "__main__":
    sys.exit(main())
