"""A run's record, ``results.json`` in its folder: what was measured (test top-1/top-5, best validation
accuracy, epochs, steps, seconds, images/s) and what made it (recipe, command line, commit, machine,
versions). Written when the test ends, after ``fit`` and by ``train.py test``; README's results tables
are rendered from copies of these records (``vit.figures``)."""

from __future__ import annotations

import functools
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import lightning as L

FILE = "results.json"
REPO = Path(__file__).resolve().parents[1]
_IMPORTED = time.perf_counter()


@functools.cache
def commit() -> dict:
    """The commit of the code that ran, and whether its tracked files differed from it (``dirty``);
    None outside a git checkout (an installed wheel: its version says what ran). Read once, at the first
    call: the commands call it when they start, so that edits made while a run trains do not count."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    if not (REPO / ".git").exists() or (sha := git("rev-parse", "HEAD")) is None:
        return {"commit": None, "dirty": None}
    # results/ holds records, what measuring writes, not code that runs
    return {"commit": sha, "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!results"))}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(accelerator: str, devices: int) -> dict:
    """The device that trained or tested (a GPU's name, else the CPU's model) and how many of them;
    on CPUs also the threads torch used and the cores it could use."""
    import torch

    cpu = {"cpu": cpu_model(), "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
           else os.cpu_count(), "torch_threads": torch.get_num_threads()}
    if accelerator == "cuda" and torch.cuda.is_available():
        return {"device": torch.cuda.get_device_name(), "device_count": devices, **cpu}
    return {"device": cpu["cpu"], "device_count": devices, **cpu}


def versions() -> dict:
    import lightning
    import timm
    import torch

    from vit import __version__

    return {"python": platform.python_version(), "torch": torch.__version__, "lightning": lightning.__version__,
            "timm": timm.__version__, "vit": __version__}


def command_line(argv: list[str], command: str = "train") -> str:
    """The command as the user typed it, as far as the process can tell: ``python scripts/NAME.py ...``
    or the console script ``vit-NAME ...``."""
    import shlex

    program = f"python scripts/{command}.py" if Path(sys.argv[0]).name == f"{command}.py" else f"vit-{command}"
    return " ".join([program, *map(shlex.quote, argv)])


def provenance(argv: list[str], command: str, accelerator: str, devices: int) -> dict:
    """What made a figure: the command line, the commit, the date, the machine and the versions."""
    return {"command": command_line(argv, command), **commit(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            **machine(accelerator, devices), "versions": versions()}


def make(*, recipe: str, argv: list[str], accelerator: str, devices: int, metrics: dict, **measured) -> dict:
    """A record: provenance first, then the figures (``metrics``: test/acc and test/acc5 as fractions)."""
    return {
        "recipe": recipe,
        **provenance(argv, "train", accelerator, devices),
        "test_top1": round(100 * float(metrics["test/acc"]), 2),
        "test_top5": round(100 * float(metrics["test/acc5"]), 2),
        **measured,
    }


def write(run: Path, record: dict, tested: str | None = None) -> Path:
    """``results.json`` (the run's record, after fit), or ``results-<checkpoint>.json`` for a later
    ``train.py test`` of one of its checkpoints, so that no record overwrites another."""
    path = run / (FILE if tested is None else f"results-{tested}.json")
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def read(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def wall_seconds() -> float:
    """Seconds since this process started (a run continued across commands: the last command's) (Linux: /proc; elsewhere since this module was imported)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


class TrainingClock(L.Callback):
    """The run's training time and progress, carried across resumes in every checkpoint: seconds inside
    ``fit`` (its training and validation epochs, not start-up or the test), optimizer steps, epochs (a
    fraction when a time budget ends one mid-way) and training images seen. The record's figures, and
    the clock that TimeToAccuracy reads."""

    def __init__(self):
        self.before = {"training_seconds": 0.0, "train_images": 0}  # of the attempts this run resumed from
        self.started = self.stopped = None
        self.trainer = None

    def on_train_start(self, trainer, pl_module):
        self.trainer, self.first_step = trainer, trainer.global_step
        self.global_batch = trainer.datamodule.batch_size * trainer.accumulate_grad_batches
        self.started, self.stopped = time.perf_counter(), None

    def on_train_end(self, trainer, pl_module):
        self.stopped = time.perf_counter()

    def seconds(self) -> float:
        if self.started is None:
            return self.before["training_seconds"]
        return self.before["training_seconds"] + (self.stopped or time.perf_counter()) - self.started

    def state_dict(self) -> dict:
        if self.trainer is None:
            return dict(self.before)
        trainer = self.trainer
        per_epoch = max(1, trainer.num_training_batches // trainer.accumulate_grad_batches) \
            if trainer.num_training_batches not in (0, float("inf")) else 1
        seconds = self.seconds()
        images = self.before["train_images"] + (trainer.global_step - self.first_step) * self.global_batch
        return {"training_seconds": round(seconds, 3), "train_images": images, "steps": trainer.global_step,
                "epochs": round(trainer.global_step / per_epoch, 2),
                "train_images_per_second": round(images / seconds, 1) if seconds > 0 else None}

    def load_state_dict(self, state_dict: dict) -> None:
        self.before = {**self.before, **state_dict}

    @staticmethod
    def of(checkpoint: dict) -> dict:
        """The clock's state in a checkpoint ({} for one written without it)."""
        return next((v for k, v in checkpoint.get("callbacks", {}).items() if k.startswith("TrainingClock")), {})
