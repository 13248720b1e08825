"""What a run shows while it trains: the progress bar (a terminal) or plain lines (a log file), and the
model summary of the first screen."""

from __future__ import annotations

import sys
import time

from lightning.pytorch.callbacks import ModelSummary as LightningModelSummary
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.progress_bar import get_standard_metrics
from lightning.pytorch.utilities import rank_zero_info


class ProgressBar(TQDMProgressBar):
    """Lightning's TQDM bar in a terminal; anywhere else (a SLURM output file, a pipe) the bars are off,
    as Lightning turns them off on ranks > 0, and rank zero prints one plain line every
    ``log_every_n_steps`` training steps and one per validation instead: a bar's carriage returns flood log
    files (Lightning #6647). The bar moves every ``log_every_n_steps`` batches, and the training loss it shows
    is read at the steps where every value is read on the host (vit.training.agreement.check_step: a read waits
    for the GPU; the steps between run without waiting).

    Either way it shows the values every process has already computed and never computes a metric
    itself: at an epoch's end that would be a synced metric's all-gather on rank zero alone, while the
    other ranks issue their next collective (a DDP deadlock; Lightning's own bar does exactly that)."""

    def __init__(self, terminal: bool | None = None):
        """
        Args:
            terminal: force the bar (True) or the lines (False); default: whether stderr is a terminal.
        """
        super().__init__()
        self.lines = not (sys.stderr.isatty() if terminal is None else terminal)
        if self.lines:
            self.disable()
        self.every = 1  # the Trainer's log_every_n_steps, once it is known (setup)
        self._started = time.perf_counter()
        self.step_loss: dict[str, float] = {}  # the training loss, read on the host at the check steps

    def setup(self, trainer, pl_module, stage):
        self.every = max(1, trainer.log_every_n_steps)
        super().setup(trainer, pl_module, stage)

    @property
    def refresh_rate(self) -> int:
        return self.every

    def get_metrics(self, trainer, pl_module):
        computed = getattr(trainer._logger_connector, "_progress_bar_metrics", {})  # filled on every rank
        return {**get_standard_metrics(trainer), **computed, **self.step_loss}

    def _line(self, trainer, text: str, prefix: str) -> None:
        metrics = {k: v for k, v in self.get_metrics(trainer, trainer.lightning_module).items() if k.startswith(prefix)}
        shown = " ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())
        elapsed = time.perf_counter() - self._started
        print(f"[{elapsed:7.0f} s] {text} {shown}".rstrip(), file=sys.stderr, flush=True)

    def on_train_start(self, trainer, pl_module):
        self._started = time.perf_counter()
        super().on_train_start(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        from vit.training.agreement import check_step

        check = check_step(trainer)
        if trainer.is_global_zero and check and (self.lines or not self.is_disabled):
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs  # (a read waits for the device:
            self.step_loss = {"train/loss_step": float(loss)}                 # here alone, not every step)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self.lines and trainer.is_global_zero and check:
            total = self.total_train_batches
            of = f"/{total}" if isinstance(total, int) else ""
            self._line(trainer, f"epoch {trainer.current_epoch} batch {batch_idx + 1}{of} step {trainer.global_step}:", "train/")

    def on_validation_end(self, trainer, pl_module):
        super().on_validation_end(trainer, pl_module)
        if self.lines and trainer.is_global_zero and not trainer.sanity_checking:
            self._line(trainer, f"epoch {trainer.current_epoch} validation:", "val/")


class ModelSummary(LightningModelSummary):
    """Lightning's model summary without its FLOPs column, which counts only with an example input and
    shows 0 here; the notes' analytic count (vit.models.model.flops_per_image) is its total instead."""

    def on_fit_start(self, trainer, pl_module):
        from vit.models.model import flops_per_image

        self.flops = flops_per_image(pl_module.model.config)
        super().on_fit_start(trainer, pl_module)

    def summarize(self, summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                  total_flops, **kwargs) -> None:
        data = [column for column in summary_data if column[0] != "FLOPs"]
        super().summarize(data, total_parameters, trainable_parameters, model_size, total_training_modes,
                          self.flops, **kwargs)
        rank_zero_info("(Total Flops: of one image's forward pass at full size, the notes' count; a training "
                       "step costs 3× that per image)")
