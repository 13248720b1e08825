"""`python scripts/rollout.py`, the same program as `vit-rollout` (see --help)."""

import sys

from vit.commands.rollout import main

if __name__ == "__main__":
    sys.exit(main())
