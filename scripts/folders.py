"""`python scripts/folders.py`, the same program as `vit-folders` (see --help)."""

import sys

from vit.commands.folders import main

if __name__ == "__main__":
    sys.exit(main())
