"""Exit statuses of ``vit-train``, and the project's error types behind them: one table, shown by
``vit-train --help`` and held equal to docs/training.md's by a test.

A known bad input raises one of the ``BadInput`` types (exit 2, one line). Anything the project did not
foresee — a bug of ours, of a user's callback or of a dataset, whatever its type — keeps its traceback
(exit 1): no built-in exception type is ever read as a bad input. Which error ends a command with which
of these statuses, and with which line, is read in one place: vit.failures.
"""

from __future__ import annotations

from dataclasses import dataclass


class BadInput(Exception):
    """A bad input the user can correct; the message is the one line printed (exit 2)."""


class ConfigError(BadInput, ValueError):
    """A bad configuration value; the message names the field and what it accepts."""


class DatasetError(BadInput):
    """Missing or malformed data; the message names the file or folder and what was expected."""


class CheckpointError(BadInput):
    """A checkpoint that cannot be used: missing, corrupt, crafted, or a model that does not fit."""


class RunError(BadInput, ValueError):
    """A run folder that cannot be used as asked; the message says what to do instead."""


class AcceleratorUnusable(BadInput):
    """GPUs were allocated to the job but torch cannot use them (a driver older than torch's CUDA, a CPU build)."""


class MissingExtra(BadInput):
    """An optional part of the package is not installed (Gradio for vit-demo, ONNX's packages for vit-export);
    the message says how to install it."""


class TrainingDiverged(RuntimeError):
    """The loss or the gradients became non-finite; the message says where and what to try (exit 3)."""


class Stopped(RuntimeError):
    """The run stopped before its end where it can resume; the message says from where (exit 4)."""


class Preempted(Stopped):
    """SLURM asked the job to stop (SIGUSR1 before a time limit or a preemption); the message says
    whether the job was requeued and where it resumes."""


class RunFailed(RuntimeError):
    """A command that ``vit-plan`` or ``vit-figures`` started failed, or could not start, or `wandb sync` did
    not upload a run ``vit-sync`` gave it; its own output, above, says why (with its traceback, if a bug). The
    command ends with one line naming it and exit 1: the status of a failure that is not a bad input of its
    own (no status of vit-train's table of its own)."""


class LostProcesses(RuntimeError):
    """The processes of a multi-process run lost each other: a collective timed out or a peer died (exit 5).
    A stuck process ends with the same status (vit.training.guards.Watchdog)."""


class StorageFull(RuntimeError):
    """The disk is full or the quota exceeded (ENOSPC, EDQUOT) where the run writes (exit 6)."""


class OutOfDeviceMemory(RuntimeError):
    """The accelerator ran out of memory (torch.OutOfMemoryError) (exit 7)."""


@dataclass(frozen=True)
class Exit:
    status: int
    error: type[BaseException] | None
    meaning: str
    resumes: str = "—"  # whether the same command (with --ckpt_path last, as train.sbatch runs it) continues the run


EXITS = (
    Exit(0, None, "done"),
    Exit(1, None, "a bug (ours, a user's callback's, a dataset's): its traceback"),
    Exit(2, BadInput, "one line on stderr: a bad configuration value, missing or malformed data, a checkpoint "
                      "that cannot be used (missing, corrupt, crafted, or a model that does not fit the command "
                      "line), GPUs allocated that torch cannot use (it names torch's CUDA and what the driver "
                      "reports), a run folder another process is training in (it names that process) — nothing in "
                      "the run folder is overwritten", "no: correct the input first"),
    Exit(3, TrainingDiverged, "training diverged: the loss or the gradients became non-finite. One line gives the "
                              "step, the epoch, the last finite loss and what to try; no checkpoint with non-finite "
                              "weights is written (the last good `last.ckpt` and best checkpoint stay), no test is run",
         "no: change the settings"),
    Exit(4, Stopped, "stopped before the end, where it resumes: preempted on SLURM (SIGUSR1: every process stops at "
                     "the same step and writes it to `step.ckpt`; `train.sbatch` and a plan's job array requeue the "
                     "job, which resumes from there), or `--stop_after_minutes` (continue with `--ckpt_path last`)", "yes"),
    Exit(5, LostProcesses, "a process is stuck or the processes of a multi-process run lost each other: one "
                           "started or finished no batch for `--ddp_timeout` seconds (waiting for its data, or "
                           "for the others in a collective: it prints where each of its threads is; a start and "
                           "a first batch of each image size, where torch.compile compiles, get an hour), or one "
                           "died (under gloo or NCCL), or one alone was sent SIGTERM (the others end so when it stops at "
                           "its step's end): one line from each process. Where one process fails for "
                           "another cause, the others end with its status and a line that names it", "yes"),
    Exit(6, StorageFull, "the disk is full or the quota exceeded: one line names the path, the run's last good "
                         "checkpoint and the command that resumes; no checkpoint is torn (each is written whole "
                         "or not at all)", "yes, once space is freed"),
    Exit(7, OutOfDeviceMemory, "the accelerator ran out of memory: one line gives the per-device batch and what to "
                               "try (gradient accumulation keeps the global batch)", "no: a smaller per-device batch"),
)


RESUME_HEADER = "the same command resumes (with `--ckpt_path last`, as `train.sbatch` runs it)"


def status_of(error: BaseException) -> int | None:
    """The exit status of a known error, None for anything else (a bug: exit 1 with its traceback)."""
    if isinstance(error, RunFailed):
        return 1
    return next((e.status for e in EXITS if e.error is not None and isinstance(error, e.error)), None)


def markdown() -> str:
    """The exit table of docs/training.md."""
    rows = [f"| {e.status} | {e.meaning} | {e.resumes} |" for e in EXITS]
    return "\n".join([f"| status | meaning | {RESUME_HEADER} |", "| --- | --- | --- |", *rows]) + "\n"


def text() -> str:
    """The table for --help."""
    import re
    import textwrap

    plain = [f"{e.status}  " + textwrap.fill(re.sub(r"`([^`]*)`", r"\1", e.meaning + (
        f" [same command resumes: {e.resumes}]" if e.resumes != "—" else "")), 96, subsequent_indent="   ")
        for e in EXITS]
    return "exit status (the same command: with --ckpt_path last, as train.sbatch runs it):\n" + "\n".join(plain)
