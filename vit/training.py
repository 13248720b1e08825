"""The training recipe (LightningModule), the W&B logger that never blocks, and callbacks."""

from __future__ import annotations

import netrc
import os
import time
from dataclasses import asdict

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import WandbLogger as _LightningWandbLogger
from lightning.pytorch.utilities import rank_zero_info
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from vit.data import CIFAR10_MEAN, CIFAR10_STD
from vit.model import VisionTransformer, load_pretrained


class ViTClassifier(L.LightningModule):
    """ViT + the recipe: AdamW (no decay on the model's no-decay set), warmup + cosine per step,
    label smoothing, random erasing and Mixup/CutMix from timm, top-1/top-5 from torchmetrics.

    ``lr`` is the learning rate for a global batch of ``lr_batch_size`` images; the optimizer gets
    ``lr × global_batch / lr_batch_size`` (linear scaling), whatever the number of GPUs and nodes.
    """

    def __init__(
        self,
        image_size: int = 32,
        patch_size: int = 4,
        in_channels: int = 3,
        num_classes: int = 10,
        dim: int = 192,
        depth: int = 12,
        heads: int = 3,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        drop_path: float = 0.0,
        lr: float = 1e-3,
        lr_batch_size: int = 512,
        min_lr: float = 1e-5,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_epochs: float = 5.0,
        label_smoothing: float = 0.0,
        mixup: float = 0.0,
        cutmix: float = 0.0,
        mix_prob: float = 1.0,
        random_erasing: float = 0.0,
        mean: tuple[float, ...] = CIFAR10_MEAN,
        std: tuple[float, ...] = CIFAR10_STD,
        pretrained: str | None = None,
        compile: bool = False,
    ):
        super().__init__()
        self.save_hyperparameters()
        for name, value in (("lr", lr), ("lr_batch_size", lr_batch_size)):
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value!r}")
        for name, value in (("min_lr", min_lr), ("weight_decay", weight_decay), ("warmup_epochs", warmup_epochs),
                            ("mixup", mixup), ("cutmix", cutmix)):
            if value < 0:
                raise ValueError(f"{name} must be non-negative, got {value!r}")
        for name, value in (("label_smoothing", label_smoothing), ("mix_prob", mix_prob),
                            ("random_erasing", random_erasing)):
            if not 0 <= value <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        if len(mean) != in_channels or len(std) != in_channels or min(std) <= 0:
            raise ValueError(f"mean and std need {in_channels} values each (std > 0), got {mean}, {std}")
        self.model = VisionTransformer(image_size, patch_size, in_channels, num_classes, dim, depth, heads,
                                       mlp_ratio, dropout, attn_dropout, drop_path)
        if pretrained:
            load_pretrained(self.model, pretrained)
        if compile:
            self.model.compile()
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)
        self.class_names: list[str] = [str(i) for i in range(num_classes)]

        self.mixup_fn = None
        if (mixup > 0 or cutmix > 0) and mix_prob > 0:
            from timm.data import Mixup

            self.mixup_fn = Mixup(mixup_alpha=mixup, cutmix_alpha=cutmix, prob=mix_prob,
                                  label_smoothing=label_smoothing, num_classes=num_classes)
        self.random_erasing = None
        if random_erasing > 0:
            from timm.data.random_erasing import RandomErasing

            self.random_erasing = RandomErasing(random_erasing, mode="pixel", device="cpu")

        top5 = min(5, num_classes)
        self.train_acc = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.train_loss = MeanMetric()
        self.val_acc = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.val_acc5 = MulticlassAccuracy(num_classes, top_k=top5, average="micro")
        self.val_loss = MeanMetric()
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)  # survives a resume
        self.test_acc = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.test_acc5 = MulticlassAccuracy(num_classes, top_k=top5, average="micro")
        self.test_loss = MeanMetric()

    # --- the model as inference sees it -----------------------------------------------------
    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 B×C×H×W → float, (x/255 − mean) / std (the numbers stored in the checkpoint)."""
        return (images.float() / 255 - self.mean) / self.std

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(self.normalize(images))

    # --- steps --------------------------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        images, labels = batch
        x = self.normalize(images)
        if self.random_erasing is not None:
            self.random_erasing.device = x.device
            x = self.random_erasing(x)
        if self.mixup_fn is not None:
            x, soft_targets = self.mixup_fn(x, labels)
            logits = self.model(x)
            loss = F.cross_entropy(logits, soft_targets)  # probability targets (smoothing already in them)
        else:
            logits = self.model(x)
            loss = F.cross_entropy(logits, labels, label_smoothing=self.hparams.label_smoothing)
        self.train_loss(loss.detach())
        self.train_acc(logits.detach(), labels)
        self.log("train/loss_step", loss.detach(), on_step=True, on_epoch=False, prog_bar=True)
        self.log_dict({"train/loss": self.train_loss, "train/acc": self.train_acc}, on_step=False, on_epoch=True)
        return loss

    def _evaluate(self, batch, loss_metric, acc, acc5, prefix: str):
        images, labels = batch
        logits = self(images)
        loss_metric(F.cross_entropy(logits, labels), weight=len(labels))
        acc(logits, labels)
        acc5(logits, labels)
        self.log_dict({f"{prefix}/loss": loss_metric, f"{prefix}/acc": acc, f"{prefix}/acc5": acc5},
                      on_step=False, on_epoch=True, prog_bar=prefix == "val")
        return logits

    def validation_step(self, batch, batch_idx):
        return self._evaluate(batch, self.val_loss, self.val_acc, self.val_acc5, "val")

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:
            self.val_acc_best(self.val_acc.compute())
        self.log("val/acc_best", self.val_acc_best.compute() if self.val_acc_best.update_called else 0.0,
                 prog_bar=True)

    def test_step(self, batch, batch_idx):
        return self._evaluate(batch, self.test_loss, self.test_acc, self.test_acc5, "test")

    # --- optimisation -------------------------------------------------------------------------
    def configure_optimizers(self):
        from timm.optim import create_optimizer_v2
        from timm.scheduler import CosineLRScheduler

        hp, trainer = self.hparams, self.trainer
        batch_size = trainer.datamodule.hparams.batch_size
        global_batch = batch_size * trainer.world_size * trainer.accumulate_grad_batches
        lr = hp.lr * global_batch / hp.lr_batch_size
        total = trainer.estimated_stepping_batches
        if total == float("inf"):
            raise ValueError("set --trainer.max_epochs or --trainer.max_steps: the cosine schedule needs a length")
        epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else 1
        warmup = min(int(round(hp.warmup_epochs * total / epochs)), int(total) - 1)
        rank_zero_info(f"global batch {global_batch}: lr {hp.lr:g} × {global_batch}/{hp.lr_batch_size} = {lr:g}; "
                       f"{warmup} warmup steps, then cosine to {hp.min_lr:g} at step {int(total)}")
        fused = self.device.type == "cuda"
        optimizer = create_optimizer_v2(self.model, "adamw", lr=lr, weight_decay=hp.weight_decay,
                                        betas=tuple(hp.betas), **({"fused": True} if fused else {}))
        scheduler = CosineLRScheduler(optimizer, t_initial=max(int(total) - warmup, 1), lr_min=hp.min_lr,
                                      warmup_t=warmup, warmup_lr_init=lr * 1e-3 if warmup else lr,
                                      warmup_prefix=True, t_in_epochs=False)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def configure_callbacks(self):
        from lightning.pytorch.callbacks import LearningRateMonitor

        return [EpochSeed()] + ([LearningRateMonitor("step")] if self.trainer.loggers else [])

    def lr_scheduler_step(self, scheduler, metric):
        scheduler.step_update(num_updates=self.global_step)  # timm schedulers step by update count

    # --- what a checkpoint carries ------------------------------------------------------------
    def setup(self, stage: str) -> None:
        classes = getattr(getattr(self.trainer, "datamodule", None), "classes", None)
        if classes:
            if len(classes) != self.hparams.num_classes:
                raise ValueError(f"the data has {len(classes)} classes but the model has num_classes="
                                 f"{self.hparams.num_classes}")
            self.class_names = list(classes)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Everything classification needs, in plain types: no config file, no Lightning."""
        logger = self.logger if isinstance(self.logger, _LightningWandbLogger) else None
        checkpoint["vit"] = {
            "config": asdict(self.model.config),
            "class_names": list(self.class_names),
            "mean": self.mean.flatten().tolist(),
            "std": self.std.flatten().tolist(),
            "wandb_run_id": logger.version if logger is not None else None,
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "vit" in checkpoint:
            self.class_names = list(checkpoint["vit"]["class_names"])


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


def wandb_credentials_present() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


class WandbLogger(_LightningWandbLogger):
    """Lightning's WandbLogger that never waits for an interactive login: without credentials (and
    without an explicit WANDB_MODE) it logs offline, to be uploaded later with `wandb sync`."""

    def __init__(self, *args, **kwargs):
        mode = os.environ.get("WANDB_MODE")
        if not kwargs.get("offline") and mode is None and not wandb_credentials_present():
            kwargs["offline"] = True
            rank_zero_info("wandb: no credentials found (WANDB_API_KEY or `wandb login`), logging offline; "
                           "upload later with `wandb sync <run dir>`")
        super().__init__(*args, **kwargs)

    def resume(self, run_id: str) -> None:
        """Continue the W&B run ``run_id`` (call before the experiment starts)."""
        if self._experiment is None:
            self._wandb_init.update(id=run_id, resume="allow")
            self._id = run_id


class WandbSamplePredictions(L.Callback):
    """At the end of each validation, log a table of sample images with label, prediction, confidence."""

    def __init__(self, num_samples: int = 16):
        self.num_samples = num_samples
        self._batch = None

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if batch_idx == 0 and trainer.is_global_zero:
            n = self.num_samples
            self._batch = (batch[0][:n].cpu(), batch[1][:n].cpu(), outputs[:n].float().softmax(-1).cpu())

    def on_validation_epoch_end(self, trainer, pl_module):
        logger = trainer.logger
        if trainer.sanity_checking or self._batch is None or not isinstance(logger, _LightningWandbLogger):
            return
        import wandb

        images, labels, probs = self._batch
        conf, pred = probs.max(-1)
        names = pl_module.class_names
        rows = [[wandb.Image(img.permute(1, 2, 0).numpy()), names[y], names[p], round(c, 4)]
                for img, y, p, c in zip(images, labels.tolist(), pred.tolist(), conf.tolist())]
        logger.log_table("val/samples", columns=["image", "label", "prediction", "confidence"], data=rows)
        self._batch = None


class TimeToAccuracy(L.Callback):
    """Log the wall time (s since fit started) at which ``val/acc`` first reaches each threshold,
    as ``time_to/val_acc_<threshold>``, and print one line when it happens."""

    def __init__(self, thresholds: tuple[float, ...] = (0.90, 0.93, 0.94)):
        self.thresholds = sorted(thresholds)
        self.reached: dict[float, float] = {}

    def on_fit_start(self, trainer, pl_module):
        self.start = time.perf_counter()

    def on_validation_epoch_end(self, trainer, pl_module):
        acc = trainer.callback_metrics.get("val/acc")
        if trainer.sanity_checking or acc is None:
            return
        elapsed = time.perf_counter() - self.start
        for t in self.thresholds:
            if t not in self.reached and acc.item() >= t:
                self.reached[t] = elapsed
                rank_zero_info(f"val/acc {acc.item():.4f} >= {t:.2f} after {elapsed:.1f} s "
                               f"(epoch {trainer.current_epoch}, step {trainer.global_step})")
        if self.reached:
            pl_module.log_dict({f"time_to/val_acc_{t:.2f}": s for t, s in self.reached.items()})


class WandbRollout(L.Callback):
    """Every ``every_n_epochs`` validations, log attention-rollout overlays of the same first
    ``num_images`` validation images to W&B, to watch attention sharpen as the model learns."""

    def __init__(self, num_images: int = 4, every_n_epochs: int = 5):
        self.num_images, self.every_n_epochs = num_images, every_n_epochs

    def on_validation_epoch_end(self, trainer, pl_module):
        logger = trainer.logger
        if (trainer.sanity_checking or not trainer.is_global_zero or not isinstance(logger, _LightningWandbLogger)
                or trainer.current_epoch % self.every_n_epochs):
            return
        from vit.rollout import explain
        from vit.visualize import overlay, upsample

        val_set = trainer.datamodule.val_set
        images = torch.stack([val_set[i][0] for i in range(min(self.num_images, len(val_set)))])
        probs, rollout = explain(pl_module.model, pl_module.normalize(images.to(pl_module.device)))
        names = pl_module.class_names
        pictures = [overlay(img, upsample(r.cpu(), *img.shape[-2:])) for img, r in zip(images, rollout)]
        captions = [f"{names[p.argmax()]} ({p.max():.2f})" for p in probs.cpu()]
        logger.log_image(key="val/rollout", images=pictures, caption=captions)
