"""W&B runs logged offline (on a compute node without a route out, or without credentials), found under a folder
and uploaded with `wandb sync` from a machine with network: the code behind `vit-sync`.

A run logged offline is a folder ``<run>/wandb/offline-run-<time>-<id>/`` holding its log, ``run-<id>.wandb``.
`wandb sync` replays that log to the W&B server and, once the server has it whole, writes the empty mark
``run-<id>.wandb.synced`` beside it; a log without its mark has not been uploaded. A resumed training logs to
the same W&B run from one offline folder per start: each is uploaded as a resume of that W&B run (wandb's
``resume="allow"``), in the order they started, so that its history, console and system metrics go on after the
lines the server holds, its steps after the server's last, instead of replacing them.
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
        """Who still trains it (vit.cluster.run_lock.holder: a process holding the run folder's lock, or a fresh heartbeat
        from another node where the file system shows this one no lock), or None: while it trains its log is not
        whole, and wandb would mark a part of it uploaded for good."""
        from vit.cluster import run_lock

        return run_lock.holder(self.folder.parent.parent)

    @property
    def uploaded(self) -> bool:
        """Every log of the folder carries wandb's mark."""
        return all(log.with_name(log.name + SYNCED).is_file() for log in self.logs)


def offline_runs(folder: Path) -> list[OfflineRun]:
    """The offline W&B runs under ``folder`` (``folder`` itself may be one), in the order they started (their
    folders' names start with the time), each once; folders without a log (a run that logged nothing) are left
    out."""
    if not folder.is_dir():
        raise exits.BadInput(f"{folder}: no such folder (give the folder that holds the runs, e.g. runs)")
    found = {log.parent.resolve() for log in folder.glob("**/offline-run-*/*.wandb")}
    if folder.name.startswith("offline-run-") and any(folder.glob("*.wandb")):
        found.add(folder.resolve())
    return sorted((OfflineRun(f) for f in found), key=lambda run: (run.folder.name, str(run.folder)))


def credentials_missing() -> str | None:
    """Why `wandb sync` would ask for a login here, or None: credentials for the W&B server are found as
    wandb finds them (vit.training.loggers.wandb_credentials_present)."""
    from vit.training.loggers import wandb_base_url, wandb_credentials_present

    if wandb_credentials_present():
        return None
    return (f"no W&B credentials for {wandb_base_url()}: run `wandb login` on this machine (or set WANDB_API_KEY), "
            f"then this command again")


def upload(runs: list[OfflineRun]) -> list[OfflineRun]:
    """Upload ``runs`` with one `wandb sync` (its own lines go to this command's output); the runs it did not
    mark uploaded, if any."""
    if not runs:
        return []
    command = [sys.executable, "-m", "wandb", "sync", *(str(run.folder) for run in runs)]
    env = {**os.environ}
    env.pop("WANDB_MODE", None)  # a job script's WANDB_MODE=offline, exported here too, is no reason not to upload
    # each log continues its W&B run where the server's copy ends (offsets of its files, its steps), whether its
    # training asked for a resume or not: a W&B run's later start never replaces what an earlier one uploaded
    env["WANDB_RESUME"] = "allow"
    subprocess.run(command, env=env, check=False)  # (its status is read from the marks: they say which runs)
    return [run for run in runs if not run.uploaded]
