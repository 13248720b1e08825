"""Callbacks the training tests add through the CLI (`--trainer.callbacks+=callbacks.StopAfterEpoch`)."""

import lightning as L


class StopAfterEpoch(L.Callback):
    """Stop cleanly after epoch ``epoch`` (0-based), as a job hitting its time limit would."""

    def __init__(self, epoch: int = 0):
        self.epoch = epoch

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch >= self.epoch:
            trainer.should_stop = True


class PoisonAtEpoch(L.Callback):
    """Make the weights non-finite at the start of epoch ``epoch``, as a diverging run would."""

    def __init__(self, epoch: int = 1):
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch:
            import torch

            with torch.no_grad():
                pl_module.model.head.weight.fill_(float("inf"))


class SlowSteps(L.Callback):
    """Sleep after each training step, so that a signal can arrive in the middle of an epoch."""

    def __init__(self, seconds: float = 0.2):
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        import time

        time.sleep(self.seconds)


class StallRank(L.Callback):
    """Rank ``rank`` stops answering for ``seconds`` after epoch 0, as a stuck or desynchronised process."""

    def __init__(self, rank: int = 1, seconds: float = 25):
        self.rank, self.seconds = rank, seconds

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.global_rank == self.rank and trainer.current_epoch == 0:
            import time

            time.sleep(self.seconds)


class RaiseMidTraining(L.Callback):
    """A user's callback with a bug: raises ``error`` (a built-in exception type's name) at step 2."""

    def __init__(self, error: str = "ValueError"):
        self.error = error

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 2:
            raise getattr(__import__("builtins"), self.error)("a bug in the user's callback")


class CrashAtStep(L.Callback):
    """The process dies at the end of step ``step``, before that step's checkpoints: with ``kill``, by
    SIGKILL (as `kill -9`, a lost node or the out-of-memory killer), else by an exception. Under torchrun,
    only the process of rank ``rank`` (None: any), and only in torchrun's first attempt."""

    def __init__(self, step: int = 5, kill: bool = True, rank: int | None = None):
        self.step, self.kill, self.rank = step, kill, rank

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        import os
        import signal

        if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
            return
        if trainer.global_step == self.step and self.rank in (None, trainer.global_rank):

            if self.kill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"crashed at step {self.step}")


class CrashInValidation(L.Callback):
    """The run crashes in epoch ``epoch``'s validation: after the epoch's last step, before its end-of-epoch
    checkpoints."""

    def __init__(self, epoch: int = 0):
        self.epoch = epoch

    def on_validation_start(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch and not trainer.sanity_checking:
            raise RuntimeError(f"crashed in the validation of epoch {self.epoch}")


class CountSteps(L.Callback):
    """Each optimizer step executed, one line per step in ``<run>/steps.<rank>``, over every attempt."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        from pathlib import Path

        with open(Path(trainer.default_root_dir) / f"steps.{trainer.global_rank}", "a") as f:
            f.write(f"{trainer.global_step}\n")
