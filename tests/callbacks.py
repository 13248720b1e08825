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
