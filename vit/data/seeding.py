"""Seeding: every random draw of an epoch depends only on (run seed, epoch, rank), so a resumed run
continues exactly as an uninterrupted one."""

from __future__ import annotations

import os

import lightning as L


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of epoch ``epoch``'s order and per-sample draws of a run seeded ``seed``: one formula for the
    data order (vit.data.resume.EpochOrder, vit.data.device_data.DeviceBatches) and each sample's augmentation
    (vit.data.resume.sample_seed), so that they stay in step."""
    return seed * 1_000_003 + epoch


class EpochSeed(L.Callback):
    """Seed every RNG from (run seed, epoch, rank) right before each epoch's train iterator is made,
    so the shuffle, the workers' augmentations, dropout and Mixup/CutMix of an epoch depend only on
    that epoch: a run resumed from an epoch-end checkpoint continues exactly as an uninterrupted one.

    Lightning makes the first epoch's iterator of a ``fit`` early (``configure_optimizers`` asks for
    ``estimated_stepping_batches``), after ``setup`` and the checkpoint restore; later epochs' after
    ``on_train_epoch_start``. Hence: seed epoch 0 in ``setup``, the resumed epoch in
    ``load_state_dict``, and every later epoch at its start.
    """

    def __init__(self):
        self.start_epoch = self.next_epoch = 0

    def _seed(self, epoch: int) -> None:
        seed = (self.base_seed + 1_000_003 * epoch + 7919 * self.rank) % 2**31
        L.seed_everything(seed, workers=True, verbose=False)
        os.environ["PL_GLOBAL_SEED"] = str(self.base_seed)

    def setup(self, trainer, pl_module, stage):
        if stage == "fit":
            self.base_seed, self.rank = int(os.environ.get("PL_GLOBAL_SEED", 0)), trainer.global_rank
            self._seed(self.start_epoch)

    def load_state_dict(self, state_dict):
        self.start_epoch = state_dict.get("next_epoch", 0)
        if hasattr(self, "base_seed"):
            self._seed(self.start_epoch)

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch != self.start_epoch:  # the first epoch of this fit is seeded already
            self._seed(trainer.current_epoch)

    def on_validation_end(self, trainer, pl_module):  # epoch-end checkpoints are written here
        if not trainer.sanity_checking:
            self.next_epoch = trainer.current_epoch + 1

    def on_train_epoch_end(self, trainer, pl_module):
        self.next_epoch = trainer.current_epoch + 1

    def state_dict(self):
        return {"next_epoch": self.next_epoch}
