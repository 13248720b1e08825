"""`python scripts/export.py`, the same program as `vit-export` (see --help)."""

import sys

from vit.commands.export import main

if __name__ == "__main__":
    sys.exit(main())
