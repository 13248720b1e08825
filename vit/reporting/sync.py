"""Find offline W&B runs and upload them with `wandb sync` (the code behind `vit-sync`).

`wandb sync` marks an uploaded log ``run-<id>.wandb`` with an empty ``run-<id>.wandb.synced`` beside it. A resumed
training has one offline folder per start; they are uploaded in order as resumes of one W&B run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from vit import exits

SYNCED = ".synced"  # wandb's mark: run-<id>.wandb.synced beside run-<id>.wandb


@dataclass(frozen=True)
class OfflineRun:
    folder: Path  # wandb/offline-run-<time>-<id>/

    @property
    def logs(self) -> list[Path]:
        return sorted(self.folder.glob("*.wandb"))

    @property
    def trainer(self) -> dict | None:
        """Who still trains this run (lock holder or fresh heartbeat), or None. Don't upload before it ends: wandb
        would mark the partial log as uploaded for good."""
        from vit.cluster import run_lock

        return run_lock.holder(self.folder.parent.parent)

    @property
    def uploaded(self) -> bool:
        """Whether every log in the folder has wandb's mark."""
        return all(log.with_name(log.name + SYNCED).is_file() for log in self.logs)


def offline_runs(folder: Path) -> list[OfflineRun]:
    """The offline W&B runs with a log under ``folder`` (or ``folder`` itself), oldest first."""
    if not folder.is_dir():
        raise exits.BadInput(f"{folder}: no such folder (give the folder that holds the runs, e.g. runs)")
    found = {log.parent.resolve() for log in folder.glob("**/offline-run-*/*.wandb")}
    if folder.name.startswith("offline-run-") and any(folder.glob("*.wandb")):
        found.add(folder.resolve())
    return sorted((OfflineRun(f) for f in found), key=lambda run: (run.folder.name, str(run.folder)))


def credentials_missing() -> str | None:
    """Why `wandb sync` would ask for a login here, or None if W&B credentials are found."""
    from vit.training.loggers import wandb_base_url, wandb_credentials_present

    if wandb_credentials_present():
        return None
    return (f"no W&B credentials for {wandb_base_url()}: run `wandb login` on this machine (or set WANDB_API_KEY), "
            f"then this command again")


def upload(runs: list[OfflineRun]) -> list[OfflineRun]:
    """Upload ``runs`` with one `wandb sync`; return those it did not mark uploaded."""
    if not runs:
        return []
    command = [sys.executable, "-m", "wandb", "sync", *(str(run.folder) for run in runs)]
    env = {**os.environ}
    env.pop("WANDB_MODE", None)  # an exported WANDB_MODE=offline would stop the upload
    # append to the server's copy of the W&B run, so a later start never replaces an earlier one's upload
    env["WANDB_RESUME"] = "allow"
    subprocess.run(command, env=env, check=False)  # success is read from the marks, per run
    return [run for run in runs if not run.uploaded]
