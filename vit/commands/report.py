"""`vit-report RUN_DIR`: draw a run's figures again — learning curves from its metrics.csv, and the test
confusion matrix and example images from its best checkpoint (as the run's checkpoint callback recorded
it; the newest checkpoint where none monitors a metric), evaluated again on the test set with the
run's own config (config.yaml). Extra arguments go to `vit-train test` (e.g. --data.root DIR).

Exit status as for vit-train test: 0 written, 2 the run folder or its checkpoint cannot be used.
"""

from __future__ import annotations

import sys
from pathlib import Path

from vit.cluster import runs
from vit.commands import train
from vit.exits import RunError
from vit.failures import exit_on_failure


@exit_on_failure
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    run, extra = Path(argv[0]), argv[1:]
    ckpt = runs.best_checkpoint(run) if (run / "config.yaml").is_file() else None
    if ckpt is None:
        raise RunError(f"{run}: not a run folder (it needs config.yaml and checkpoints/)")
    return train.main(["test", "--config", str(run / "config.yaml"), "--ckpt_path", str(ckpt),
                       "--trainer.logger", "false", *extra])
