"""Run folders: all a training run writes lives in ``<root>/version_N`` or in a folder named after its launch.

A launch's name (``slurm-<job>``, ``torchrun-<id>``) lets a requeued job continue its run; see ``open_for_fit``."""

from __future__ import annotations

import os
from pathlib import Path

from vit.models.checkpoints import read_checkpoint
from vit.exits import CheckpointError, RunError
from vit.cluster import run_lock
from vit.cluster.launch import attempt, launch_name

CHECKPOINTS = "checkpoints"
WANDB_ID = "wandb_id"
LAST = "last.ckpt"  # at each epoch's end
STEP = "step.ckpt"  # mid-epoch, every few minutes, and where a preempted job stopped
ENV = "VIT_RUN_DIR"
RUNS = "VIT_RUNS"
RESUMES = "VIT_RESUMES"  # the checkpoint the process that set ENV resumes from ("": none), for those it starts


def runs_folder() -> Path:
    """The default parent of all runs: ``$VIT_RUNS``, else ``./runs``."""
    return Path(os.environ.get(RUNS) or "runs")


def wandb_id(run: Path, known: str | None = None) -> str:
    """The run folder's W&B run id, fixed on first call (``known``, else random) and kept in ``<run>/wandb_id`` so
    that every attempt and process logs to one W&B run, even one preempted before any checkpoint. Race-safe."""
    import secrets

    path = run / WANDB_ID
    if not path.is_file():
        draft = run / f".{WANDB_ID}.{os.getpid()}.{secrets.token_hex(4)}"
        # starts with a letter: an id like 65e28918 reads back from config.yaml as a float
        new = secrets.choice("abcdfghijklmnopqrstuvwxyz") + secrets.token_hex(4)
        draft.write_text((known or new) + "\n")
        try:
            os.link(draft, path)  # fails if another process linked its id first
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    return path.read_text().strip()


def sweep_run_id() -> str | None:
    """The W&B run id a sweep agent assigned (WANDB_RUN_ID with WANDB_SWEEP_ID set), else None."""
    return os.environ.get("WANDB_RUN_ID") or None if os.environ.get("WANDB_SWEEP_ID") else None


def saved_step(path: Path) -> tuple[int, float | None] | None:
    """(global step, ``SAVED_AT`` or None) of a checkpoint; None if unreadable. ``mmap`` keeps it cheap."""
    import torch

    from vit.cluster.checkpoint_io import SAVED_AT

    ckpt = None
    for lazily in (True, False):  # (a file system that cannot map files: read it whole)
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=lazily)
            break
        except Exception:  # noqa: BLE001 - a corrupt file can fail anywhere in torch.load; read_checkpoint says why
            continue
    step = ckpt.get("global_step") if isinstance(ckpt, dict) else None
    if not isinstance(step, int):
        return None
    saved = ckpt.get(SAVED_AT)
    return step, saved if isinstance(saved, float) else None


def recency(path: Path, known: tuple[int, float | None] | None = None) -> tuple[int, float]:
    """Sort key, newest last: (1, its recorded ``SAVED_AT``), else (0, file mtime). A copy renews mtimes, so a
    file without a recorded time never outranks one with it. ``known``: its ``saved_step`` if read already."""
    known = known if known is not None else saved_step(path)
    return (1, known[1]) if known and known[1] is not None else (0, path.stat().st_mtime)


def checkpoints(run: Path) -> list[Path]:
    """The run's checkpoints, newest first by save time (``recency``), not step: a run restarted from an earlier
    checkpoint follows its new branch. At equal times last.ckpt, then step.ckpt, then the rest. Unreadable files
    (a copied file may be torn) come first, so that ``newest_readable`` names them as it skips them."""
    folder = run / CHECKPOINTS
    found = [p for p in folder.glob("*.ckpt") if p.is_file()] if folder.is_dir() else []
    steps = {p: saved_step(p) for p in found}

    def order(path: Path) -> tuple:
        if steps[path] is None:
            return (0, path.name)
        recorded, when = recency(path, steps[path])
        return (1, -recorded, -when, path.name not in (STEP, LAST), path.name != LAST, -steps[path][0], path.name)

    return sorted(found, key=order)


def last_checkpoint(run: Path) -> Path | None:
    """The run's newest checkpoint (``checkpoints``), read or not."""
    return next(iter(checkpoints(run)), None)


def best_checkpoint(run: Path) -> Path | None:
    """The best checkpoint that a monitoring ModelCheckpoint recorded in the newest readable one (else the newest),
    looked up in this run's folder: a copied run's record names the old one. None if none; RunError if it is gone."""
    found = newest_readable(run)
    if found is None:
        return None
    path, ckpt, _ = found
    states = ckpt.get("callbacks") if isinstance(ckpt.get("callbacks"), dict) else {}
    best = next((state["best_model_path"] for state in states.values() if isinstance(state, dict)
                 and state.get("monitor") and state.get("best_model_path")), None)
    if best is None:
        return path
    here = run / CHECKPOINTS / Path(best).name
    if not here.is_file():
        raise RunError(f"{run}: its best checkpoint, {Path(best).name} (by {path.name}'s record), is not in "
                       f"{run / CHECKPOINTS}")
    return here


def newest_readable(run: Path) -> tuple[Path, dict, str] | None:
    """(path, contents, skip note) of the newest readable checkpoint; None if none exist; RunError if none reads."""
    skipped = []
    for path in checkpoints(run):
        try:
            return path, read_checkpoint(path), "".join(f"; skipped {reason}" for reason in skipped)
        except CheckpointError as e:
            skipped.append(str(e))
    if skipped:
        raise RunError(f"{run}: no checkpoint of this run reads ({'; '.join(skipped)}): move them away to "
                       f"start the run anew, or resume from a copy with --ckpt_path FILE")
    return None


def newest_run(root: Path) -> Path | None:
    """The run under ``root`` whose newest checkpoint was saved last (``recency``)."""
    latest = {}
    for run in root.iterdir() if root.is_dir() else ():
        found = [p for p in (run / CHECKPOINTS).glob("*.ckpt") if p.is_file()] if run.is_dir() else []
        if found:
            latest[run] = max(recency(p) for p in found)
    return max(latest, key=latest.get, default=None)


def run_of(checkpoint: Path) -> Path | None:
    """The run folder a checkpoint was written into, if it sits in one (``<run>/checkpoints/*.ckpt``)."""
    return checkpoint.resolve().parent.parent if checkpoint.resolve().parent.name == CHECKPOINTS else None


def claim_new_version(root: Path, claimed: list[Path]) -> Path:
    """Create and return ``root/version_N`` for the next free N (atomic: two runs never share one); the folders
    it makes go into ``claimed``."""
    run_lock.make(root, claimed)
    taken = [int(d.name.removeprefix("version_")) for d in root.glob("version_*")
             if d.name.removeprefix("version_").isdigit()]
    n = max(taken, default=-1) + 1
    while True:
        try:
            (root / f"version_{n}").mkdir(parents=True)  # (a refused start may have removed an empty root)
            claimed.append(root / f"version_{n}")
            return root / f"version_{n}"
        except FileExistsError:
            n += 1


def resolve(root: Path, ckpt_path: str | None, name: str | None,
            claimed: list[Path]) -> tuple[Path, str | None, str]:
    """(run folder, line to print or None, "" or " (the newest run under ROOT)") for a fit. ``ckpt_path``: None
    (new run), "last" (the newest run, or run ``name``; ``decide`` picks the checkpoint once the folder is held),
    or a file (its own run folder if it sits in one). ``name``: a run folder under ``root`` chosen by the user.
    A folder named by ``name`` or the launch that holds a run goes on with it: from "last", from one of its own
    checkpoints, or (``name``) from a file; a start from nothing or, under the launch's name, from another file
    is refused. A named folder is made as its lock is taken (run_lock.take). Folders it makes go into ``claimed``."""
    fixed = name or launch_name()
    run = root / fixed if fixed else None
    if run and ckpt_path != "last" and not (ckpt_path and (name or run_of(Path(ckpt_path)) == run.resolve())) \
            and last_checkpoint(run):
        raise RunError(f"--run {name}: {run} holds a run already; resume it with --ckpt_path last, or choose "
                       f"another name" if name else f"{run} holds a run already, which an earlier training "
                       f"command with this launch's name ({fixed}) wrote: give this command its own folder with "
                       f"--run NAME, or continue that run with --ckpt_path last")
    if ckpt_path and ckpt_path != "last":
        ckpt = Path(ckpt_path)
        run = run or run_of(ckpt) or claim_new_version(root, claimed)
        return run, f"resuming from {ckpt}; this run writes into {run}", ""
    if run:
        return run, None, ""
    if ckpt_path == "last":
        run = newest_run(root)
        if run is not None:
            return run, None, f" (the newest run under {root})"
        return claim_new_version(root, claimed), \
            f"--ckpt_path last: no run under {root} has a checkpoint yet; starting a new run", ""
    return claim_new_version(root, claimed), None, ""


def command_id(argv: list[str]) -> str:
    """The command line's digest, alike in every attempt of a launch: which of a launch's commands wrote a checkpoint."""
    import hashlib

    return hashlib.sha256("\0".join(map(str, argv)).encode()).hexdigest()[:16]


def own_newest(run: Path, command: str | None) -> bool:
    """Whether this command of this launch (any attempt) wrote the newest readable checkpoint of ``run``."""
    try:
        found = newest_readable(run)
    except RunError:
        return False
    vit = found[1].get("vit") if found is not None else None
    return isinstance(vit, dict) and launch_name() is not None and vit.get("launch") == launch_name() and \
        vit.get("command", command) == command  # (an earlier version's checkpoint records no command)


def place_outputs(cfg, run: Path, known_wandb_id: str | None) -> None:
    """Point the Trainer, loggers and folderless checkpoint callbacks at ``run``; W&B at its ``wandb_id``."""
    cfg.trainer.default_root_dir = str(run)
    loggers = cfg.trainer.logger
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        if not hasattr(logger, "init_args"):
            continue
        init = logger.init_args
        init.save_dir = str(run)
        if logger.class_path.startswith("lightning.") and logger.class_path.endswith(("CSVLogger", "TensorBoardLogger")):
            init.name, init.version = "", ""  # metrics straight into the run folder
        elif logger.class_path.endswith("WandbLogger"):
            init.name = init.get("name") or f"{run.parent.name}/{run.name}"
            init.id = init.get("id") or wandb_id(run, known_wandb_id or sweep_run_id())
    for callback in cfg.trainer.callbacks or []:
        if callback.class_path.endswith("ModelCheckpoint") and not callback.init_args.get("dirpath"):
            callback.init_args.dirpath = str(run / CHECKPOINTS)


def open_for_fit(root: Path, ckpt_path: str | None, name: str | None, arch: dict, data: dict,
                 claimed: list[Path], command: str | None = None) -> tuple[Path, tuple[Path, dict] | None]:
    """The fit's run folder and resume checkpoint (path, contents; None: new run), decided once by process 0
    (``decide``) and handed on: over the process group when a launcher started the processes (launch.join_group),
    through ``ENV``/``RESUMES`` when Lightning spawns them afterwards. Process 0's refusal is every process's."""
    from vit.cluster.launch import from_process_zero
    from vit.models.checkpoints import module_key

    if os.environ.get(ENV):
        run, resume_from = Path(os.environ[ENV]), os.environ.get(RESUMES) or None
    else:
        decided: list = []  # process 0's (run, (checkpoint, its contents))

        def on_zero() -> tuple[Path, tuple[Path, dict] | None]:
            decided.append(decide(root, ckpt_path, name, arch, data, claimed, command))
            run, resume = decided[0]
            return run, resume and (resume[0], what_the_others_read(resume[1], module_key(data)))

        run, resume = from_process_zero(on_zero, "run folder and the checkpoint it resumes from")
        return decided[0] if decided else (run, resume)
    return run, resume_from and (Path(resume_from), read_checkpoint(resume_from))


def what_the_others_read(ckpt: dict, data_key: str) -> dict:
    """What other processes need of a checkpoint before Lightning loads it: metadata, data position, no weights."""
    return {key: ckpt[key] for key in ("vit", "loops", "global_step", data_key) if key in ckpt}


def decide(root: Path, ckpt_path: str | None, name: str | None, arch: dict, data: dict,
           claimed: list[Path], command: str | None = None) -> tuple[Path, tuple[Path, dict] | None]:
    """Process 0's decision: the run folder, locked (run_lock), and the resume checkpoint, checked against ``arch``
    and ``data``; created folders go into ``claimed``. A later attempt resumes from its own newest checkpoint,
    whatever ``ckpt_path`` said. Drafts of killed saves are deleted last: no save can be running yet."""
    from lightning.pytorch.utilities import rank_zero_info

    from vit.cluster.checkpoint_io import remove_drafts
    from vit.models.checkpoints import check_checkpoint

    fixed = name or launch_name()
    if ckpt_path != "last" and attempt() != "0" and fixed and own_newest(root / fixed, command):
        rank_zero_info(f"attempt {attempt()} of this launch: it continues from its run folder's newest checkpoint, "
                       f"which it wrote" + (f"; --ckpt_path {ckpt_path} is where its first attempt started"
                                            if ckpt_path else ""))
        ckpt_path = "last"
    resume = None
    if ckpt_path not in (None, "last"):  # (checked before any folder is named, locked or made)
        resume = (Path(ckpt_path), read_checkpoint(ckpt_path))
        check_checkpoint(resume[1], ckpt_path, data, arch)
    run, note, found = resolve(root, ckpt_path, name, claimed)
    if taken := run_lock.take(run, claimed=claimed):
        rank_zero_info(taken)
    if ckpt_path == "last" and (newest := newest_readable(run)):
        resume_from, ckpt, skipped = newest
        check_checkpoint(ckpt, resume_from, data, arch)
        resume, note = (resume_from, ckpt), f"resuming {run}{found} from its {resume_from.name}{skipped}"
    rank_zero_info(note or f"run folder: {run}")
    if drafts := remove_drafts(run / CHECKPOINTS):
        rank_zero_info(f"removed {len(drafts)} draft(s) of checkpoint saves that were killed "
                       f"({sum(size for _, size in drafts) / 1e6:.1f} MB) from {run / CHECKPOINTS}: "
                       f"{', '.join(name for name, _ in drafts)}")
    return run, resume
