"""Full disk or exceeded quota (ENOSPC, EDQUOT): one line with the path, last good checkpoint and resume command."""

from __future__ import annotations

import errno
import shlex
from pathlib import Path

from vit.cluster import launch

STORAGE_FULL = (errno.ENOSPC, errno.EDQUOT)


def storage_full(error: OSError) -> bool:
    return error.errno in STORAGE_FULL


def resume_command(argv: list[str], run: Path) -> str:
    """The command line that resumes ``run``; under SLURM an sbatch line (train.sbatch adds --ckpt_path last)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--ckpt_path", "--run"):
            skip = True
        elif not arg.startswith(("--ckpt_path=", "--run=")):
            kept.append(arg)
    if launch.slurm_job():
        return shlex.join(["sbatch", "scripts/slurm/train.sbatch", *kept, "--run", run.name])
    return shlex.join(["python", "scripts/train.py", *kept, "--ckpt_path", "last", "--run", run.name])


def storage_message(error: OSError, run: Path | None, argv: list[str]) -> str:
    """One line: the path, the cause, the run's last good checkpoint and the command that resumes."""
    from vit.cluster import runs
    from vit.exits import RunError

    where = f" writing {error.filename}" if error.filename else ""
    cause = "no space left on the device" if error.errno == errno.ENOSPC else "the disk quota is exceeded"
    line = f"{cause}{where} ({errno.errorcode[error.errno]}: a full disk or an exceeded quota, not a bug)."
    if run is None:
        return line
    try:
        found = runs.newest_readable(run)
    except RunError:
        found = None
    last = f"its last good checkpoint is {found[0]} (step {found[1].get('global_step')})" if found else \
        "it has no checkpoint yet"
    return (f"{line} The run folder {run} is intact (checkpoints are written whole or not at all); {last}. Free "
            f"space, then resume with the same command: {resume_command(argv, run)}")
