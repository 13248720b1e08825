"""Run a plan of training runs here or as a SLURM job array, and render its table: `python scripts/plan.py`
(same as `vit-plan`)."""

import sys

from vit.commands.plan import main

if __name__ == "__main__":
    sys.exit(main())
