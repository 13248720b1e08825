"""Classify images with a trained checkpoint: `python scripts/classify.py --checkpoint CKPT IMAGE|DIR ...`."""

import sys

from vit.classify import main

if __name__ == "__main__":
    sys.exit(main())
