"""Measure README's figures and render its tables: `python scripts/figures.py` (same as `vit-figures`)."""

import sys

from vit.commands.figures import main

if __name__ == "__main__":
    sys.exit(main())
