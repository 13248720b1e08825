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
