"""Callbacks a recipe lists (configs/*.yaml): throughput, time to accuracy, and what W&B shows (the
resolved config, sample predictions, attention rollout). The run's own machinery is elsewhere: what stops
a run (vit.guards), what it shows (vit.progress), seeding (vit.seeding), its clock and record
(vit.results); vit.commands.train attaches those to every run."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_info

from vit.loggers import wandb_logger


class TimeToAccuracy(L.Callback):
    """Log the training time (the run's clock, vit.results.TrainingClock: seconds inside fit, summed over
    resumes) at which ``val/acc`` first reaches each threshold, as ``time_to/val_acc_<threshold>``, and
    print one line when it happens. The times reached are kept in checkpoints and in the run's record."""

    def __init__(self, thresholds: tuple[float, ...] = (0.90, 0.93, 0.94)):
        self.thresholds = sorted(thresholds)
        self.reached: dict[float, float] = {}

    def state_dict(self):
        return {"reached": {str(t): s for t, s in self.reached.items()}}

    def load_state_dict(self, state_dict):
        self.reached = {float(t): s for t, s in state_dict.get("reached", {}).items()}

    def on_validation_epoch_end(self, trainer, pl_module):
        from vit.results import TrainingClock

        acc = trainer.callback_metrics.get("val/acc")
        if trainer.sanity_checking or acc is None:
            return
        elapsed = next(cb for cb in trainer.callbacks if isinstance(cb, TrainingClock)).seconds()
        for t in self.thresholds:
            if t not in self.reached and acc.item() >= t:
                self.reached[t] = elapsed
                rank_zero_info(f"val/acc {acc.item():.4f} >= {t:.2f} after {elapsed:.1f} s of training "
                               f"(epoch {trainer.current_epoch}, step {trainer.global_step})")
        if self.reached:
            pl_module.log_dict({f"time_to/val_acc_{t:.2f}": s for t, s in self.reached.items()})


def _wandb(trainer) -> WandbLogger | None:
    return wandb_logger(trainer.loggers)


class WandbSamplePredictions(L.Callback):
    """At the end of each validation, log a table of sample images with label, prediction, confidence."""

    def __init__(self, num_samples: int = 16):
        self.num_samples = num_samples
        self._batch = None

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if batch_idx == 0 and trainer.is_global_zero and _wandb(trainer):
            n = self.num_samples
            self._batch = (batch[0][:n].cpu(), batch[1][:n].cpu(), outputs[:n].float().softmax(-1).cpu())

    def on_validation_epoch_end(self, trainer, pl_module):
        logger = _wandb(trainer)
        if trainer.sanity_checking or self._batch is None or logger is None:
            return
        import wandb

        images, labels, probs = self._batch
        conf, pred = probs.max(-1)
        names = pl_module.class_names
        rows = [[wandb.Image(img.permute(1, 2, 0).numpy()), names[y], names[p], round(c, 4)]
                for img, y, p, c in zip(images, labels.tolist(), pred.tolist(), conf.tolist())]
        logger.log_table("val/samples", columns=["image", "label", "prediction", "confidence"], data=rows)
        self._batch = None


class WandbRollout(L.Callback):
    """Every ``every_n_epochs`` validations, log attention-rollout overlays of the same first
    ``num_images`` validation images to W&B, to watch attention sharpen as the model learns."""

    def __init__(self, num_images: int = 4, every_n_epochs: int = 5):
        self.num_images, self.every_n_epochs = num_images, every_n_epochs

    def on_validation_epoch_end(self, trainer, pl_module):
        logger = _wandb(trainer)
        if (trainer.sanity_checking or not trainer.is_global_zero or logger is None
                or trainer.current_epoch % self.every_n_epochs):
            return
        from vit.rollout import explain
        from vit.visualize import overlay, upsample

        val_set = trainer.datamodule.val_set
        images = torch.stack([val_set[i][0] for i in range(min(self.num_images, len(val_set)))])
        probs, rollout = explain(pl_module.eval_model, pl_module.normalize(images.to(pl_module.device)))
        names = pl_module.class_names
        pictures = [overlay(img, upsample(r.cpu(), *img.shape[-2:])) for img, r in zip(images, rollout)]
        captions = [f"{names[p.argmax()]} ({p.max():.2f})" for p in probs.cpu()]
        logger.log_image(key="val/rollout", images=pictures, caption=captions)


def batch_size(batch) -> int:
    return batch[0].size(0)


class Throughput(ThroughputMonitor):
    """Lightning's ThroughputMonitor: samples/s, and with the model's analytic FLOPs per batch (the notes'
    count, ``ViTClassifier.flops_per_batch``) TFLOP/s and MFU against Lightning's table of device peaks."""

    def __init__(self, window_size: int = 100):
        super().__init__(batch_size_fn=batch_size, window_size=window_size)


class LogConfig(SaveConfigCallback):
    """LightningCLI's config.yaml in the run folder, and the whole resolved config (trainer, callbacks,
    model, data) in the W&B run's config."""

    def save_config(self, trainer, pl_module, stage) -> None:
        wandb = _wandb(trainer)
        if wandb is not None:
            import yaml

            wandb.experiment.config.update(yaml.safe_load(self.parser.dump(self.config, skip_none=False)),
                                           allow_val_change=True)
