"""Run folders: everything one training run writes — checkpoints, W&B files, metrics, the resolved
config, the bad-file list, figures — lives in one folder, ``<root>/version_N`` (as Lightning's
loggers number theirs). A new run claims the next version; a resumed run keeps its folder.

Processes of one launch agree on the folder: Lightning's own DDP launcher passes it to the processes it
starts (``VIT_RUN_DIR``); processes started by SLURM or torchrun name it after their launch
(``slurm-<job id>``, ``torchrun-<run id>``), so a requeued job continues in its folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from vit.exits import RunError

CHECKPOINTS = "checkpoints"
LAST = "last.ckpt"
ENV = "VIT_RUN_DIR"


def last_checkpoint(run: Path) -> Path | None:
    path = run / CHECKPOINTS / LAST
    return path if path.is_file() else None


def newest_run(root: Path) -> Path | None:
    """The run under ``root`` whose last.ckpt was written last."""
    runs = [d for d in root.iterdir() if d.is_dir() and last_checkpoint(d)] if root.is_dir() else []
    return max(runs, key=lambda d: last_checkpoint(d).stat().st_mtime, default=None)


def run_of(checkpoint: Path) -> Path | None:
    """The run folder a checkpoint was written into, if it sits in one (``<run>/checkpoints/*.ckpt``)."""
    return checkpoint.resolve().parent.parent if checkpoint.resolve().parent.name == CHECKPOINTS else None


def claim_new_version(root: Path) -> Path:
    """Create and return ``root/version_N`` for the next free N (atomic: two runs never share one)."""
    root.mkdir(parents=True, exist_ok=True)
    taken = [int(d.name.removeprefix("version_")) for d in root.glob("version_*")
             if d.name.removeprefix("version_").isdigit()]
    n = max(taken, default=-1) + 1
    while True:
        try:
            (root / f"version_{n}").mkdir()
            return root / f"version_{n}"
        except FileExistsError:
            n += 1


def slurm_job() -> str | None:
    """The id of the SLURM batch job this process is a task of (Lightning's own test: srun's
    SLURM_NTASKS, not an interactive allocation), whatever its number of tasks; else None."""
    env = os.environ
    if "SLURM_NTASKS" not in env or env.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return None
    if env.get("SLURM_ARRAY_JOB_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID")


def torchrun_id() -> str | None:
    """The rendezvous id of the torchrun launch this process belongs to, else None."""
    env = os.environ
    launched = all(k in env for k in ("TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE", "GROUP_RANK"))
    return env["TORCHELASTIC_RUN_ID"] if launched and env["TORCHELASTIC_RUN_ID"] != "none" else None


def launch_name() -> str | None:
    """The shared name of a run whose processes an external launcher started: every SLURM job has its
    own (one task or many), so a job never resumes or writes into another job's run."""
    env, job, rdzv = os.environ, slurm_job(), torchrun_id()
    if job:
        return f"slurm-{job}"
    if rdzv:
        return f"torchrun-{rdzv}"
    if int(env.get("WORLD_SIZE", 1)) > 1:
        return f"launch-{env.get('MASTER_ADDR', 'localhost')}-{env.get('MASTER_PORT', 0)}"
    return None


def allocation() -> tuple[int, int] | None:
    """(processes per node, nodes) as the launcher allocated them — a SLURM job's tasks, torchrun's
    --nproc-per-node and --nnodes — or None when no launcher started this process."""
    env = os.environ
    if slurm_job():
        nodes = int(env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", 1)))
        return int(env["SLURM_NTASKS"]) // nodes, nodes
    if torchrun_id():
        per_node = int(env["LOCAL_WORLD_SIZE"])
        return per_node, int(env["WORLD_SIZE"]) // per_node
    return None


def resolve(root: Path, ckpt_path: str | None, name: str | None) -> tuple[Path, Path | None, str | None]:
    """(run folder, checkpoint to resume or None, one line to print or None) for a ``fit``.

    ``ckpt_path``: None (a new run), "last" (the newest run of ``root``, or the run ``name``), or a file
    (its own run folder when it sits in one). ``name``: a run folder under ``root`` chosen by the user.
    """
    shared = os.environ.get(ENV)
    if shared:  # a process started by Lightning's DDP launcher: the launching process chose
        run = Path(shared)
        return run, (last_checkpoint(run) if ckpt_path == "last" else ckpt_path and Path(ckpt_path)), None
    fixed = name or launch_name()
    if ckpt_path and ckpt_path != "last":
        ckpt = Path(ckpt_path)
        run = root / fixed if fixed else run_of(ckpt) or claim_new_version(root)
        run.mkdir(parents=True, exist_ok=True)
        return run, ckpt, f"resuming from {ckpt}; this run writes into {run}"
    if fixed:
        run = root / fixed
        ckpt = last_checkpoint(run) if ckpt_path == "last" else None
        if ckpt is None and last_checkpoint(run) and name:
            raise RunError(f"--run {name}: {run} holds a run already; resume it with --ckpt_path last, "
                           f"or choose another name")
        run.mkdir(parents=True, exist_ok=True)
        return run, ckpt, f"resuming {run} from its {LAST}" if ckpt else None
    if ckpt_path == "last":
        run = newest_run(root)
        if run is not None:
            return run, last_checkpoint(run), f"resuming {run} (the newest run under {root}) from its {LAST}"
        return claim_new_version(root), None, f"--ckpt_path last: no run under {root} has a {LAST} yet; starting a new run"
    return claim_new_version(root), None, None
