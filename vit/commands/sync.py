"""`vit-sync [FOLDER ...]` / `python scripts/sync.py [FOLDER ...]`: upload the W&B runs logged offline under
each FOLDER (default: $VIT_RUNS, else runs) that are not uploaded yet, with `wandb sync`, from a machine with
network (a cluster's login node). Runs already uploaded are left alone: running it again uploads only what is new.
The starts of a resumed training are one W&B run: each goes on after what is uploaded already. A run that still
trains (its folder's lock is held, or its heartbeat, rewritten every minute, is fresh) is left for later.

Exit status: 0 every offline run is uploaded (or there was none); 1 `wandb sync` did not upload some of them
(its own lines, above, say why; the next run of this command tries them again); 2 no such FOLDER, or no W&B
credentials here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vit import exits
from vit.failures import exit_on_failure
from vit.cluster.runs import runs_folder


@exit_on_failure
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vit-sync", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="*", type=Path, default=[runs_folder()], metavar="FOLDER",
                   help="searched whole for <run>/wandb/offline-run-*/ (default: $VIT_RUNS, else runs)")
    p.add_argument("--dry-run", action="store_true", help="list what would be uploaded, upload nothing")
    args = p.parse_args(argv)
    from vit.reporting.sync import credentials_missing, offline_runs, upload

    found = {run.folder: run for folder in args.folders for run in offline_runs(folder)}
    runs = sorted(found.values(), key=lambda run: (run.folder.name, str(run.folder)))
    waiting = [run for run in runs if not run.uploaded]
    training = {run: trainer for run in waiting if (trainer := run.trainer) is not None}
    waiting = [run for run in waiting if run not in training]
    where = ", ".join(map(str, args.folders))
    if training:
        print(f"left for later: {plural(len(training), 'offline W&B run')} still training"
              + "".join(f"\n  {shown(run.folder)}: {still(trainer)}" for run, trainer in training.items()))
    if not waiting:
        print(f"nothing to upload: {plural(len(runs), 'offline W&B run')} under {where}"
              + (", all uploaded" if runs and not training else ""))
        return 0
    listed = "".join(f"\n  {shown(run.folder)}" for run in waiting)
    already = f" ({len(runs) - len(waiting)} uploaded before)" if len(runs) > len(waiting) else ""
    if args.dry_run:
        print(f"would upload {plural(len(waiting), 'offline W&B run')} of {len(runs)} under {where}{already}:{listed}")
        return 0
    if (why := credentials_missing()) is not None:
        raise exits.BadInput(why)
    print(f"uploading {plural(len(waiting), 'offline W&B run')} of {len(runs)} under {where}{already}:{listed}",
          flush=True)
    failed = upload(waiting)
    done = [run for run in waiting if run not in failed]
    print(f"uploaded {plural(len(done), 'run')}" + "".join(f"\n  {shown(run.folder)}" for run in done))
    if failed:
        raise exits.RunFailed(f"`wandb sync` did not upload {plural(len(failed), 'run')} (its lines above say why; "
                              "run this command again to retry): " + ", ".join(shown(r.folder) for r in failed))
    return 0


def still(trainer: dict) -> str:
    """Who trains a run, and that vit-sync should be run again once it has ended."""
    from vit.cluster.run_lock import describe, heartbeat_age

    age = heartbeat_age(trainer)
    who = f"trains as {describe(trainer)}" if trainer else "its training holds the run folder's lock"
    return who + (f", heartbeat {age:.0f} s ago" if age is not None else "") + "; run vit-sync again once it has ended"


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def shown(folder: Path) -> str:
    """A run's folder relative to the working folder if it is inside it, else absolute."""
    try:
        return str(folder.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(folder)
