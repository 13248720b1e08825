"""Callbacks the training tests add through the CLI (`--trainer.callbacks+=callbacks.StopAfterEpoch`)."""

import lightning as L


class StopAfterEpoch(L.Callback):
    """Stop cleanly after epoch ``epoch`` (0-based), as a job hitting its time limit would."""

    def __init__(self, epoch: int = 0):
        self.epoch = epoch

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch >= self.epoch:
            trainer.should_stop = True
