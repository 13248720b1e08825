"""The training recipe as a LightningModule: the model knows nothing of it (vit.models.model).

Its options come in groups, as the architecture does (vit.models.model.ViTConfig): the optimizer, the schedule and the
augmentation, on the command line ``--model.optimizer.lr``, ``--model.schedule.warmup_epochs``,
``--model.augmentation.mixup``. Checkpoints of the flat options before them are read by vit.models.checkpoints.upgrade."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from jsonargparse.typing import ClosedUnitInterval, NonNegativeFloat, OpenUnitInterval, PositiveFloat, PositiveInt
from lightning.pytorch.utilities import rank_zero_info
from torchmetrics import MaxMetric, MeanMetric, Metric
from torchmetrics.classification import MulticlassAccuracy

from vit.exits import ConfigError
from vit.models.model import ViTConfig, VisionTransformer, flops_per_image, load_pretrained
from vit.models.preprocessing import CIFAR10_MEAN, CIFAR10_STD, Metadata, Normalize
from vit.training import schedule
from vit.training.graphs import graph
from vit.training.schedule import Schedule, check_stages, shared_clock


def _plain(value):
    """jsonargparse's restricted numbers (PositiveFloat, ...) as the built-in types they subclass, lists as
    tuples: no class of another library reaches a checkpoint (its options, the optimizer's groups)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    return next((kind(value) for kind in (bool, int, float, str) if isinstance(value, kind)), value)


def _plain_fields(config) -> None:
    for name in config.__dataclass_fields__:
        object.__setattr__(config, name, _plain(getattr(config, name)))


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer (``--model.optimizer.*``).

    Args:
        name: "adamw" for every weight, or "muon": timm's Muon (orthogonalised momentum) for the 2-D weights of
            the blocks (QKV, W^o, MLP), AdamW for E, the head, norms, biases, [cls] and E_pos — the split of
            the CIFAR-10 and nanoGPT speed records. Muon's Newton–Schulz iteration runs in bfloat16 on a GPU
            (timm's) and in float32 on a CPU, where bfloat16 is emulated on most CPUs and slow (vit.training.optim).
        lr: peak learning rate for a global batch of lr_batch_size images; scaled linearly to the real global
            batch (--data.batch_size × accumulation), which does not change with the number of devices.
        lr_batch_size: the global batch lr is stated for.
        weight_decay: AdamW's (and Muon's) weight decay (not on norms, biases, E_pos, [cls]).
        betas: AdamW's betas (with Muon, its AdamW's: Muon's own momentum is timm's, 0.95).
        muon_lr: Muon's peak learning rate, for a global batch of lr_batch_size (scaled as lr); default: lr
            itself, which timm's Muon makes comparable (its update is scaled to AdamW's RMS, "match_rms_adamw").
    """

    name: Literal["adamw", "muon"] = "adamw"
    lr: PositiveFloat = 1e-3
    lr_batch_size: PositiveInt = 512
    weight_decay: NonNegativeFloat = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    muon_lr: PositiveFloat | None = None

    def __post_init__(self):
        _plain_fields(self)


@dataclass(frozen=True)
class ScheduleConfig:
    """What follows the run's progress (``--model.schedule.*``): the learning rate and the training image size.
    Both are laid over the run's steps, or over --trainer.max_time, whichever ends the run first (vit.training.schedule).

    Args:
        warmup_epochs: linear warmup from lr/1000, in epochs (fractions allowed); then the cosine to min_lr.
        min_lr: learning rate at the end of the cosine.
        resize_stages: progressive resizing — smaller training images first, fewer tokens per step: pairs (image
            size, share of the run at which that stage ends), e.g. [[16, 0.25], [24, 0.5]] trains at 16 px for the
            first quarter of the run, at 24 px to its half, then at arch.image_size. Images are resized
            (antialiased bilinear) in the training step and E_pos is resampled to their grid (vit.models.model); the
            model, its checkpoint, validation and test stay at full size.
    """

    warmup_epochs: NonNegativeFloat = 5.0
    min_lr: NonNegativeFloat = 1e-5
    resize_stages: tuple[tuple[PositiveInt, OpenUnitInterval], ...] = ()

    def __post_init__(self):
        _plain_fields(self)


@dataclass(frozen=True)
class AugmentationConfig:
    """What the training step does to each batch and its targets (``--model.augmentation.*``), from timm.

    Args:
        label_smoothing: label smoothing of the cross-entropy targets (Mixup/CutMix mix the smoothed targets).
        mixup: Mixup alpha (0: off).
        cutmix: CutMix alpha (0: off).
        mix_prob: probability of applying Mixup/CutMix to a batch.
        random_erasing: probability of random erasing per image.
    """

    label_smoothing: ClosedUnitInterval = 0.0
    mixup: NonNegativeFloat = 0.0
    cutmix: NonNegativeFloat = 0.0
    mix_prob: ClosedUnitInterval = 1.0
    random_erasing: ClosedUnitInterval = 0.0

    def __post_init__(self):
        _plain_fields(self)


GROUPS = {"arch": ViTConfig, "optimizer": OptimizerConfig, "schedule": ScheduleConfig,
          "augmentation": AugmentationConfig}


def _group(name: str, value):
    """A group as given: its dataclass, or the dict a checkpoint stores (and jsonargparse may pass)."""
    cls = GROUPS[name]
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigError(f"{name} has no option {', '.join(unknown)} (its options: "
                              f"{', '.join(cls.__dataclass_fields__)})")
        return cls(**value)
    raise ConfigError(f"{name} is a group of options ({', '.join(cls.__dataclass_fields__)}), not {value!r}: "
                      f"e.g. --model.{name}.{next(iter(cls.__dataclass_fields__))}")


def step_loss(model, x: torch.Tensor, targets: torch.Tensor, labels: torch.Tensor, smoothing: float):
    """A training step's loss, and its sums for the training metrics (loss × images, correct top-1 against the
    images' own labels, images): in one graph with the model's forward and backward when the model is compiled,
    so that none of it is a launch of its own on a GPU."""
    logits = model(x)
    loss = F.cross_entropy(logits, targets, label_smoothing=smoothing)
    images = torch.full_like(loss, labels.shape[0], dtype=torch.float32)
    correct = (logits.detach().argmax(-1) == labels).sum().float()
    return loss, torch.stack([loss.detach().float() * images, correct, images])


class Sums(Metric):
    """Sums kept on the device, one add a step, summed over processes when computed (torchmetrics' sync)."""

    full_state_update = False

    def __init__(self, n: int):
        super().__init__()
        self.add_state("sums", torch.zeros(n, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, values: torch.Tensor) -> None:
        self.sums += values

    def compute(self) -> torch.Tensor:
        return self.sums


class ViTClassifier(L.LightningModule):
    """ViT + the recipe: AdamW, or Muon for the blocks' matrices (no decay on the model's no-decay set),
    warmup + cosine per step, smaller images early (progressive resizing), label smoothing, random
    erasing and Mixup/CutMix from timm, an EMA of the weights (timm's ModelEmaV3), top-1/top-5 from
    torchmetrics."""

    def __init__(
        self,
        arch: ViTConfig = ViTConfig(),
        optimizer: OptimizerConfig = OptimizerConfig(),
        schedule: ScheduleConfig = ScheduleConfig(),
        augmentation: AugmentationConfig = AugmentationConfig(),
        ema_decay: OpenUnitInterval | None = None,
        mean: tuple[float, ...] | None = None,
        std: tuple[float, ...] | None = None,
        pretrained: str | None = None,
        compile: bool = False,
    ):
        """
        Args:
            arch: the architecture (vit.models.model.ViTConfig).
            optimizer: the optimizer and its learning rate (OptimizerConfig).
            schedule: warmup, cosine and progressive resizing (ScheduleConfig).
            augmentation: label smoothing, Mixup/CutMix, random erasing (AugmentationConfig).
            ema_decay: keep an exponential moving average of the weights (timm's ModelEmaV3, with its
                warmup: the decay at step t is min(ema_decay, 1 − (1 + t)^−2/3), so a short run does not
                average in its random start); validation, test, classify and export then use the EMA
                weights (the raw ones stay in the checkpoint for resuming). None: off.
            mean: per-channel mean of the normalisation (x/255 − mean) / std; default: the pretrained
                weights' (their pretrained_cfg), else CIFAR-10's.
            std: per-channel std of the normalisation; default as for mean.
            pretrained: start from timm ViT weights: a timm model name, hf-hub:USER/REPO, local-dir:DIR, or a
                .pth/.safetensors file (loaded when fit starts, never when a checkpoint is loaded).
            compile: torch.compile the model when fit starts (one static graph per image size), and Muon's step
                with its gradient norm and clipping (one graph: vit.training.optim).
        """
        super().__init__()
        arch, optimizer = _group("arch", arch), _group("optimizer", optimizer)
        schedule, augmentation = _group("schedule", schedule), _group("augmentation", augmentation)
        if mean is None or std is None:  # resolved once and stored: a checkpoint never looks them up again
            from vit.models.hub import pretrained_normalization

            default_mean, default_std = (pretrained and pretrained_normalization(pretrained)) or (CIFAR10_MEAN, CIFAR10_STD)
            mean, std = mean or default_mean, std or default_std
        self.save_hyperparameters(ignore=list(GROUPS))
        self.hparams.update(mean=tuple(mean), std=tuple(std))
        self.hparams.update({k: asdict(v) for k, v in zip(GROUPS, (arch, optimizer, schedule, augmentation))})
        self.hparams.update(_plain(dict(self.hparams)))  # plain types: checkpoints load with weights_only=True
        self.optimizer_config, self.augmentation_config = optimizer, augmentation
        self.schedule_config = schedule
        self.model = VisionTransformer(arch)
        self.ema = None
        if ema_decay is not None:
            from timm.utils import ModelEmaV3

            self.ema = ModelEmaV3(self.model, decay=ema_decay, use_warmup=True).requires_grad_(False)
        self.normalize = Normalize(mean, std)
        if len(mean) != arch.in_channels:
            raise ConfigError(f"mean and std need {arch.in_channels} values each, got {mean}, {std}")
        self.class_names: list[str] = [str(i) for i in range(arch.num_classes)]
        check_stages(schedule.resize_stages, arch.image_size, arch.patch_size)
        # the lr and the training image size follow the run's progress: vit.training.schedule builds the schedule
        # when training starts (its length is the Trainer's); until then this holds a resumed run's place
        self.schedule = Schedule(warmup=0, decay=None, image_size=arch.image_size,
                                 stages=schedule.resize_stages)
        self._said_size = arch.image_size  # the training image size last announced (one line per switch)
        # the last optimizer step's total gradient norm, before clipping, on the device: taken once a step, for
        # clipping and for the divergence guard (vit.training.guards.StopOnNonFinite); None before the first
        self.grad_norm: torch.Tensor | None = None

        aug = augmentation
        self.mixup_fn = None
        if (aug.mixup > 0 or aug.cutmix > 0) and aug.mix_prob > 0:
            from timm.data import Mixup

            self.mixup_fn = Mixup(mixup_alpha=aug.mixup, cutmix_alpha=aug.cutmix, prob=aug.mix_prob,
                                  label_smoothing=aug.label_smoothing, num_classes=arch.num_classes)

        # the metrics stay on the device, and are read when they are logged: no argument or NaN check, which
        # would read a value on the host at every step (the targets are the data's, a NaN loss is the
        # divergence guard's: vit.training.guards.StopOnNonFinite)
        k, top5 = arch.num_classes, min(5, arch.num_classes)
        accuracy = functools.partial(MulticlassAccuracy, k, average="micro", validate_args=False)
        mean = functools.partial(MeanMetric, nan_strategy="disable")
        self.train_sums = Sums(3)  # the training loss × images, the correct top-1, the images
        self.val_acc, self.val_acc5, self.val_loss = accuracy(top_k=1), accuracy(top_k=top5), mean()
        self.val_acc_best = MaxMetric(nan_strategy="disable")
        self.val_acc_best.persistent(True)  # survives a resume
        self.test_acc, self.test_acc5, self.test_loss = accuracy(top_k=1), accuracy(top_k=top5), mean()

    @property
    def eval_model(self):
        """The weights that are validated, tested, classified and exported: the EMA's when it is on."""
        return self.ema.module if self.ema is not None else self.model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images → logits of the evaluated weights, normalised as the checkpoint says (vit.models.preprocessing)."""
        return self.eval_model(self.normalize(images))

    @property
    def mixes_pairs(self) -> bool:
        """Whether each process's batch must be even: timm's Mixup/CutMix mixes its images in pairs
        (vit.data.datamodules.split_batch refuses an odd share before training)."""
        return self.mixup_fn is not None

    @property
    def flops_per_batch(self) -> int:
        """Analytic FLOPs of one training step of one process (vit.models.model.flops_per_image), for Throughput."""
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
        if self.augmentation_config.random_erasing > 0:
            x = self.erase(x)
        targets = labels
        if self.mixup_fn is not None:
            x, targets = self.mixup_fn(x, labels)  # probability targets (smoothing already in them)
        smoothing = 0.0 if self.mixup_fn is not None else self.augmentation_config.label_smoothing
        loss, sums = graph(step_loss, self.hparams.compile)(self.model, x, targets, labels, smoothing)
        self.train_sums.update(sums)
        # on the device until the loggers read it, every log_every_n_steps steps (the progress bar shows
        # that value: vit.training.progress)
        self.log("train/loss_step", loss.detach(), on_step=True, on_epoch=False)
        return loss

    def on_train_epoch_end(self):
        loss, correct, images = self.train_sums.compute()  # summed over processes: equal on every one
        self.train_sums.reset()
        if images > 0:  # (none where a resume started at an epoch's last batch)
            self.log_dict({"train/loss": loss / images, "train/acc": correct / images}, sync_dist=True)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        """The step's total gradient norm, taken once (``grad_norm``), and clipping by norm with it as torch's
        clip_grad_norm_ clips. Muon's step takes both (compiled with it when the model is: vit.training.optim);
        another optimizer's gradients are clipped here, in a few ops (vit.training.optim.clip). Lightning calls this
        after a gradient scaler (16-mixed) has unscaled them; an optimizer that unscales them itself, and
        clipping by value, are left to Lightning."""
        from vit.training.optim import Muon, clip

        by_norm = gradient_clip_algorithm in (None, "norm")
        scaled = getattr(optimizer, "_step_supports_amp_scaling", False) and \
            getattr(self.trainer.precision_plugin, "scaler", None) is not None
        if isinstance(optimizer, Muon):
            optimizer.max_norm = gradient_clip_val if by_norm else None  # (its step clips, and keeps the norm)
        elif not scaled:
            params = [p for p in self.trainer.precision_plugin.main_params(optimizer) if p.grad is not None]
            self.grad_norm = clip([p.grad for p in params], gradient_clip_val if by_norm else None) \
                if params else None
        if gradient_clip_val and (scaled or not by_norm):
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def erase(self, x: torch.Tensor) -> torch.Tensor:
        """timm's RandomErasing (mode "pixel") per image, batched (vit.data.device_augment): draws and noise from the
        process's RNG, the rectangles by torch.compile's graph when the model is compiled."""
        from vit.data.device_augment import erase, random_erasing_draws

        draws = random_erasing_draws(x.shape[0], x.device)
        return graph(erase, self.hparams.compile)(x, draws, self.augmentation_config.random_erasing,
                                                   torch.randn_like(x))

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        """The update, then the EMA's: both before the step's callbacks, so that a checkpoint written at the
        step's end (vit.data.resume) holds the EMA of this very step. Muon's step took the gradient norm."""
        from vit.training.optim import Muon

        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        inner = getattr(optimizer, "optimizer", optimizer)  # (Lightning's wrapper of it)
        if isinstance(inner, Muon):
            self.grad_norm = inner.grad_norm
        if self.ema is not None:
            self.ema.update(self.model, step=self.global_step + 1)  # Lightning counts the step after this hook

    def _evaluate(self, batch, loss_metric, acc, acc5, prefix: str):
        images, labels = batch
        logits = self(images)
        # each image's loss: the epoch's value is their mean over every image, whatever the batches' sizes (a
        # batch's mean with weight= would not do: MeanMetric's nan_strategy "disable" drops the weights)
        loss_metric(F.cross_entropy(logits, labels, reduction="none"))
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
        self.test_predictions.append((logits.float().softmax(-1).cpu(), batch[1].cpu()))  # for vit.reporting.report
        return logits

    # --- optimisation -------------------------------------------------------------------------
    def configure_optimizers(self):
        """AdamW (or Muon) and timm's warmup + cosine, stepped per update. The cosine spans the run: its
        steps, or — when ``--trainer.max_time`` is set — the time budget, whichever ends the run first, so a
        run cut off by the clock still ends at ``min_lr``."""
        from timm.optim import create_optimizer_v2

        o, s, trainer = self.optimizer_config, self.schedule_config, self.trainer
        global_batch = trainer.datamodule.batch_size * trainer.accumulate_grad_batches
        lr = o.lr * global_batch / o.lr_batch_size
        self.schedule, length = schedule.for_run(trainer, s.warmup_epochs, self.model.config.image_size,
                                                 s.resize_stages, self.schedule.state_dict())
        split = f" = {trainer.world_size} processes × {trainer.datamodule.process_batch()}" * (trainer.world_size > 1)
        rank_zero_info(f"global batch {global_batch}{split}: lr {o.lr:g} × {global_batch}/{o.lr_batch_size} = {lr:g}; "
                       f"{self.schedule.warmup} warmup steps, then cosine to {s.min_lr:g} at {length}")
        if o.name == "muon":
            from vit.training.optim import Muon, ns_dtype

            muon_lr = (o.muon_lr or o.lr) * global_batch / o.lr_batch_size
            dtype = ns_dtype(self.device)
            rank_zero_info(f"Muon for the blocks' matrices (lr {muon_lr:g}), its Newton–Schulz iteration in "
                           f"{str(dtype).removeprefix('torch.')}")
            optimizer = Muon(self.param_groups(lr, muon_lr), lr=muon_lr, weight_decay=o.weight_decay,
                             betas=o.betas, ns_dtype=dtype, compiled=self.hparams.compile)
        else:
            fused = self.device.type == "cuda"
            optimizer = create_optimizer_v2(self.model, "adamw", lr=lr, weight_decay=o.weight_decay,
                                            betas=o.betas, **({"fused": True} if fused else {}))
        scheduler = self.schedule.lr_scheduler(optimizer, lr, s.min_lr)
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
        wd = self.optimizer_config.weight_decay
        return [{"params": muon, "lr": muon_lr, "weight_decay": wd},
                {"params": decay, "lr": lr, "weight_decay": wd, "use_fallback": True},
                {"params": rest, "lr": lr, "weight_decay": 0.0, "use_fallback": True}]

    def lr_scheduler_step(self, scheduler, metric):
        """timm's schedulers step by update count: the schedule's position (vit.training.schedule), which also
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
        run's callbacks add: vit.training.callbacks.WandbRunId; vit.training.guards.StopOnNonFinite refuses non-finite weights)."""
        checkpoint["vit"] = {**checkpoint.get("vit", {}), **self.metadata().to_dict()}
        checkpoint["schedule"] = self.schedule.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "vit" in checkpoint:
            self.class_names = list(checkpoint["vit"]["class_names"])
        old = checkpoint.get("vit", {})  # (checkpoints written before the schedule had its own entry)
        self.schedule.load_state_dict(checkpoint.get("schedule") or {"warmup_end_time": old.get("warmup_end_time"),
                                                                    "share": old.get("run_share", 0.0)})
