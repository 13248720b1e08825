"""Train a ViT: `python scripts/train.py [--config configs/FILE.yaml] [--section.field VALUE ...]`.

With no --config it trains the default recipe, configs/vit_cifar10.yaml. `--help` lists every field.
"""

import sys

from vit.cli import main

if __name__ == "__main__":
    sys.exit(main())
