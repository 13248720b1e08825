"""Attention rollout figures: `python scripts/rollout.py --checkpoint CKPT IMAGE ... --output-dir DIR`."""

import sys

from vit.visualize import main

if __name__ == "__main__":
    sys.exit(main())
