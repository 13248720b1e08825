"""`python scripts/report.py RUN_DIR`, the same program as `vit-report` (see --help)."""

import sys

from vit.commands.report import main

if __name__ == "__main__":
    sys.exit(main())
