"""`python scripts/classify.py`, the same program as `vit-classify` (see --help)."""

import sys

from vit.commands.classify import main

if __name__ == "__main__":
    sys.exit(main())
