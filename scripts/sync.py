"""`python scripts/sync.py`, the same program as `vit-sync` (see --help)."""

import sys

from vit.commands.sync import main

if __name__ == "__main__":
    sys.exit(main())
