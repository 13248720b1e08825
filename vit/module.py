"""The training recipe as a LightningModule: the model knows nothing of it (vit.model)."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from jsonargparse.typing import ClosedUnitInterval, NonNegativeFloat, OpenUnitInterval, PositiveFloat, PositiveInt
from lightning.pytorch.utilities import rank_zero_info
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from vit.exits import ConfigError
from vit.model import ViTConfig, VisionTransformer, flops_per_image, load_pretrained, mimetic_init_
from vit.preprocessing import CIFAR10_MEAN, CIFAR10_STD, Metadata, Normalize, flip_averaged
from vit import schedule
from vit.schedule import Schedule, check_stages, shared_clock


class ViTClassifier(L.LightningModule):
    """ViT + the recipe: AdamW, or Muon for the blocks' matrices (no decay on the model's no-decay set),
    warmup + cosine per step, smaller images early (progressive resizing), label smoothing, random
    erasing and Mixup/CutMix from timm, an EMA of the weights (timm's ModelEmaV3), top-1/top-5 from
    torchmetrics."""

    def __init__(
        self,
        arch: ViTConfig = ViTConfig(),
        lr: PositiveFloat = 1e-3,
        lr_batch_size: PositiveInt = 512,
        min_lr: NonNegativeFloat = 1e-5,
        weight_decay: NonNegativeFloat = 0.05,
        betas: tuple[float, float] = (0.9, 0.999),
        optimizer: Literal["adamw", "muon"] = "adamw",
        muon_lr: PositiveFloat | None = None,
        muon_ns_dtype: Literal["auto", "bfloat16", "float32"] = "auto",
        ema_decay: OpenUnitInterval | None = None,
        resize_stages: tuple[tuple[PositiveInt, OpenUnitInterval], ...] = (),
        warmup_epochs: NonNegativeFloat = 5.0,
        label_smoothing: ClosedUnitInterval = 0.0,
        mixup: NonNegativeFloat = 0.0,
        cutmix: NonNegativeFloat = 0.0,
        mix_prob: ClosedUnitInterval = 1.0,
        random_erasing: ClosedUnitInterval = 0.0,
        mean: tuple[float, ...] | None = None,
        std: tuple[float, ...] | None = None,
        pretrained: str | None = None,
        compile: bool = False,
        pos_init: Literal["normal", "sincos"] = "normal",
        decay: Literal["cosine", "linear"] = "cosine",
        tta_flip: bool = False,
        mimetic: tuple[float, float, float, float] | None = None,
    ):
        """
        Args:
            arch: the architecture (vit.model.ViTConfig).
            lr: peak learning rate for a global batch of lr_batch_size images; scaled linearly to the
                real global batch (--data.batch_size × accumulation), which does not change with the
                number of devices.
            lr_batch_size: the global batch lr is stated for.
            min_lr: learning rate at the end of the cosine decay.
            weight_decay: AdamW weight decay (not on norms, biases, E_pos, [cls]).
            betas: AdamW betas.
            optimizer: "adamw" for every weight, or "muon": timm's Muon (orthogonalised momentum) for
                the 2-D weights of the blocks (QKV, W^o, MLP), AdamW for E, the head, norms, biases,
                [cls] and E_pos — the split of the CIFAR-10 and nanoGPT speed records.
            muon_lr: Muon's peak learning rate, for a global batch of lr_batch_size (scaled as lr);
                default: lr itself, which timm's Muon makes comparable (its update is scaled to
                AdamW's RMS, "match_rms_adamw").
            muon_ns_dtype: the precision of Muon's Newton–Schulz iteration (vit.optim): "auto" is bfloat16 on a
                GPU (timm's) and float32 on a CPU, where bfloat16 is emulated on most CPUs and slow.
            ema_decay: keep an exponential moving average of the weights (timm's ModelEmaV3, with its
                warmup: the decay at step t is min(ema_decay, 1 − (1 + t)^−2/3), so a short run does not
                average in its random start); validation, test, classify and export then use the EMA
                weights (the raw ones stay in the checkpoint for resuming). None: off.
            resize_stages: progressive resizing — smaller training images first, fewer tokens per step:
                pairs (image size, share of the run at which that stage ends), e.g. [[16, 0.25], [24, 0.5]]
                trains at 16 px for the first quarter of the run, at 24 px to its half, then at
                arch.image_size. The share is of the steps, or of --trainer.max_time, whichever is
                further (as the cosine). Images are resized (antialiased bilinear) in the training step and
                E_pos is resampled to their grid (vit.model); the model, its checkpoint, validation and test
                stay at full size.
            warmup_epochs: linear warmup from lr/1000, in epochs (fractions allowed).
            label_smoothing: label smoothing of the cross-entropy targets.
            mixup: Mixup alpha (0: off).
            cutmix: CutMix alpha (0: off).
            mix_prob: probability of applying Mixup/CutMix to a batch.
            random_erasing: probability of random erasing per image.
            mean: per-channel mean of the normalisation (x/255 − mean) / std; default: the pretrained
                weights' (their pretrained_cfg), else CIFAR-10's.
            std: per-channel std of the normalisation; default as for mean.
            pretrained: start from timm ViT weights: a timm model name, hf-hub:USER/REPO, local-dir:DIR, or a
                .pth/.safetensors file (loaded when fit starts, never when a checkpoint is loaded).
            compile: torch.compile the model when fit starts.
            pos_init: E_pos's initial values: "normal" (timm's truncated normal, std 0.02) or "sincos", the 2-D
                sine-cosine embedding of Beyer et al. 2022 ("Better plain ViT baselines"); E_pos stays learnable.
            decay: the learning rate after warmup: "cosine" to min_lr, or "linear" to min_lr (reported the most
                robust under a time budget: Li et al., "Budgeted training", ICLR 2020); either over the run's
                steps or its time budget (vit.schedule).
            tta_flip: evaluate (validation, test) on each image and its mirror image, averaging the logits.
            mimetic: start each attention layer from the mimetic initialisation (vit.model.mimetic_init_, Trockman
                & Kolter 2023) with scales [α1, β1, α2, β2] (theirs: [0.7, 0.7, 0.4, 0.4]); None: timm's.
        """
        super().__init__()
        arch = ViTConfig(**arch) if isinstance(arch, dict) else arch  # a checkpoint stores it as a dict
        if mean is None or std is None:  # resolved once and stored: a checkpoint never looks them up again
            from vit.hub import pretrained_normalization

            default_mean, default_std = (pretrained and pretrained_normalization(pretrained)) or (CIFAR10_MEAN, CIFAR10_STD)
            mean, std = mean or default_mean, std or default_std
        self.save_hyperparameters(ignore=["arch"])
        self.hparams.update(mean=tuple(mean), std=tuple(std))
        self.hparams["arch"] = asdict(arch)  # plain types: checkpoints load with weights_only=True
        self.model = VisionTransformer(arch)
        if pos_init == "sincos":
            from timm.layers import build_sincos2d_pos_embed

            grid = arch.image_size // arch.patch_size
            with torch.no_grad():
                self.model.pos_embedding[0, 0].zero_()  # [cls]
                self.model.pos_embedding[0, 1:] = build_sincos2d_pos_embed([grid, grid], arch.dim)
        if mimetic is not None:
            mimetic_init_(self.model, *mimetic)
        self.ema = None
        if ema_decay is not None:
            from timm.utils import ModelEmaV3

            self.ema = ModelEmaV3(self.model, decay=ema_decay, use_warmup=True).requires_grad_(False)
        self.normalize = Normalize(mean, std)
        if len(mean) != arch.in_channels:
            raise ConfigError(f"mean and std need {arch.in_channels} values each, got {mean}, {std}")
        self.class_names: list[str] = [str(i) for i in range(arch.num_classes)]
        check_stages(resize_stages, arch.image_size, arch.patch_size)
        # the lr and the training image size follow the run's progress: vit.schedule builds the schedule
        # when training starts (its length is the Trainer's); until then this holds a resumed run's place
        self.schedule = Schedule(warmup=0, decay=None, image_size=arch.image_size,
                                 stages=tuple(tuple(s) for s in resize_stages))
        self._said_size = arch.image_size  # the training image size last announced (one line per switch)

        self.mixup_fn = None
        if (mixup > 0 or cutmix > 0) and mix_prob > 0:
            from timm.data import Mixup

            self.mixup_fn = Mixup(mixup_alpha=mixup, cutmix_alpha=cutmix, prob=mix_prob,
                                  label_smoothing=label_smoothing, num_classes=arch.num_classes)
        self.random_erasing = None
        if random_erasing > 0:
            from timm.data.random_erasing import RandomErasing

            self.random_erasing = RandomErasing(random_erasing, mode="pixel", device="cpu")

        k, top5 = arch.num_classes, min(5, arch.num_classes)
        self.train_acc = MulticlassAccuracy(k, top_k=1, average="micro")
        self.train_loss = MeanMetric()
        self.val_acc = MulticlassAccuracy(k, top_k=1, average="micro")
        self.val_acc5 = MulticlassAccuracy(k, top_k=top5, average="micro")
        self.val_loss = MeanMetric()
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)  # survives a resume
        self.test_acc = MulticlassAccuracy(k, top_k=1, average="micro")
        self.test_acc5 = MulticlassAccuracy(k, top_k=top5, average="micro")
        self.test_loss = MeanMetric()

    @property
    def eval_model(self):
        """The weights that are validated, tested, classified and exported: the EMA's when it is on."""
        return self.ema.module if self.ema is not None else self.model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images → logits of the evaluated weights, normalised as the checkpoint says (vit.preprocessing);
        with tta_flip, the mean of the image's and its mirror image's logits."""
        x = self.normalize(images)
        return flip_averaged(self.eval_model, x) if self.hparams.get("tta_flip") else self.eval_model(x)

    @property
    def mixes_pairs(self) -> bool:
        """Whether each process's batch must be even: timm's Mixup/CutMix mixes its images in pairs
        (vit.data.split_batch refuses an odd share before training)."""
        return self.mixup_fn is not None

    @property
    def flops_per_batch(self) -> int:
        """Analytic FLOPs of one training step of one process (vit.model.flops_per_image), for Throughput."""
        config = replace(self.model.config, image_size=self.train_image_size)
        return flops_per_image(config, train=True) * self.trainer.datamodule.process_batch()

    def metadata(self) -> Metadata:
        return Metadata(self.model.config, self.class_names, tuple(self.hparams.mean), tuple(self.hparams.std))

    # --- steps --------------------------------------------------------------------------------
    @property
    def train_image_size(self) -> int:
        """The side of this step's training images: the resize stage the run is in, else the model's."""
        return self.schedule.train_image_size()

    def training_step(self, batch, batch_idx):
        images, labels = batch
        x = self.normalize(images)
        size = self.train_image_size
        if size != self._said_size:
            rank_zero_info(f"step {self.global_step}: training on {size}-px images "
                           f"({(size // self.model.config.patch_size) ** 2} patch tokens)")
        self._said_size = size
        if size != x.shape[-1]:  # progressive resizing: (size/P)² tokens instead of N
            x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
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

    def optimizer_step(self, *args, **kwargs):
        """The update, then the EMA's: both before the step's callbacks, so that a checkpoint written at the
        step's end (vit.resume) holds the EMA of this very step."""
        super().optimizer_step(*args, **kwargs)
        if self.ema is not None:
            self.ema.update(self.model, step=self.global_step + 1)  # Lightning counts the step after this hook

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
                 prog_bar=True, sync_dist=True)  # equal on every rank already (from the synced val/acc)

    def on_test_epoch_start(self):
        self.test_predictions: list[tuple[torch.Tensor, torch.Tensor]] = []

    @property
    def tested_images(self) -> int:
        """How many images the last test saw (fewer than the test set under ``limit_test_batches``)."""
        return sum(len(labels) for _, labels in self.test_predictions)

    def test_step(self, batch, batch_idx):
        logits = self._evaluate(batch, self.test_loss, self.test_acc, self.test_acc5, "test")
        self.test_predictions.append((logits.float().softmax(-1).cpu(), batch[1].cpu()))  # for vit.report
        return logits

    # --- optimisation -------------------------------------------------------------------------
    def configure_optimizers(self):
        """AdamW and timm's warmup + cosine, stepped per update. The cosine spans the run: its steps,
        or — when ``--trainer.max_time`` is set — the time budget, whichever ends the run first, so a
        run cut off by the clock still ends at ``min_lr``."""
        from timm.optim import create_optimizer_v2

        hp, trainer = self.hparams, self.trainer
        global_batch = trainer.datamodule.batch_size * trainer.accumulate_grad_batches
        lr = hp.lr * global_batch / hp.lr_batch_size
        self.schedule, length = schedule.for_run(trainer, hp.warmup_epochs, self.model.config.image_size,
                                                 hp.resize_stages, self.schedule.state_dict())
        split = f" = {trainer.world_size} processes × {trainer.datamodule.process_batch()}" * (trainer.world_size > 1)
        rank_zero_info(f"global batch {global_batch}{split}: lr {hp.lr:g} × {global_batch}/{hp.lr_batch_size} = {lr:g}; "
                       f"{self.schedule.warmup} warmup steps, then {hp.get('decay', 'cosine')} to {hp.min_lr:g} at {length}")
        if hp.optimizer == "muon":
            from vit.optim import Muon, ns_dtype

            muon_lr = (hp.muon_lr or hp.lr) * global_batch / hp.lr_batch_size
            dtype = ns_dtype(hp.muon_ns_dtype, self.device)
            rank_zero_info(f"Muon for the blocks' matrices (lr {muon_lr:g}), its Newton–Schulz iteration in "
                           f"{str(dtype).removeprefix('torch.')}")
            optimizer = Muon(self.param_groups(lr, muon_lr), lr=muon_lr, weight_decay=hp.weight_decay,
                             betas=tuple(hp.betas), ns_dtype=dtype)
        else:
            fused = self.device.type == "cuda"
            optimizer = create_optimizer_v2(self.model, "adamw", lr=lr, weight_decay=hp.weight_decay,
                                            betas=tuple(hp.betas), **({"fused": True} if fused else {}))
        scheduler = self.schedule.lr_scheduler(optimizer, lr, hp.min_lr, hp.get("decay", "cosine"))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def param_groups(self, lr: float, muon_lr: float) -> list[dict]:
        """Muon for the 2-D weights of the blocks; AdamW (timm's Muon fallback) for E and the head with
        weight decay, and for the no-decay set (norms, biases, E_pos, [cls]) without."""
        no_decay = self.model.no_weight_decay()
        muon, decay, rest = [], [], []
        for name, p in self.model.named_parameters():
            if name.startswith("blocks.") and p.ndim == 2:
                muon.append(p)
            else:
                (rest if name in no_decay else decay).append(p)
        wd = self.hparams.weight_decay
        return [{"params": muon, "lr": muon_lr, "weight_decay": wd},
                {"params": decay, "lr": lr, "weight_decay": wd, "use_fallback": True},
                {"params": rest, "lr": lr, "weight_decay": 0.0, "use_fallback": True}]

    def lr_scheduler_step(self, scheduler, metric):
        """timm's schedulers step by update count: the schedule's position (vit.schedule), which also
        moves the training image size."""
        scheduler.step_update(num_updates=self.schedule.advance(self.global_step, shared_clock(self.trainer)))

    # --- weights that are not ours, and what a checkpoint carries ------------------------------
    def setup(self, stage: str) -> None:
        classes = getattr(getattr(self.trainer, "datamodule", None), "classes", None)
        if classes:
            if len(classes) != self.model.config.num_classes:
                raise ConfigError(f"the data has {len(classes)} classes but the model has num_classes="
                                 f"{self.model.config.num_classes}")
            self.class_names = list(classes)
        if stage == "fit":  # never when a checkpoint is merely loaded for inference or test
            if self.hparams.pretrained and self.trainer.ckpt_path is None:
                load_pretrained(self.model, self.hparams.pretrained)
                if self.ema is not None:
                    self.ema.set(self.model)
            if self.hparams.compile:
                self.model.compile(dynamic=False)  # one static graph per image size (resize stages)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Everything classification needs, in plain types: no config file, no Lightning (beside what the
        run's callbacks add: vit.callbacks.WandbRunId; vit.guards.StopOnNonFinite refuses non-finite weights)."""
        checkpoint["vit"] = {**checkpoint.get("vit", {}), **self.metadata().to_dict()}
        checkpoint["schedule"] = self.schedule.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "vit" in checkpoint:
            self.class_names = list(checkpoint["vit"]["class_names"])
        old = checkpoint.get("vit", {})  # (checkpoints written before the schedule had its own entry)
        self.schedule.load_state_dict(checkpoint.get("schedule") or {"warmup_end_time": old.get("warmup_end_time"),
                                                                    "share": old.get("run_share", 0.0)})
