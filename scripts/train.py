"""Train a ViT: `python scripts/train.py [--config RECIPE] [--section.field VALUE ...]` (same as `vit-train`)."""

import sys

from vit.commands.train import main

if __name__ == "__main__":
    sys.exit(main())
