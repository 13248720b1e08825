"""Callbacks a recipe can list (throughput, time to accuracy, W&B media and config), the run's clock, and
``run_callbacks``, which attaches every run's own machinery."""

from __future__ import annotations

import time

import lightning as L
import torch
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.utilities import rank_zero_info

from vit.models.checkpoints import CLOCK
from vit.training.guards import wall_seconds
from vit.training.commits import code, code_of
from vit.training.loggers import wandb_logger


class TrainingClock(L.Callback):
    """The run's training time and progress, carried across resumes in checkpoints: the record's figures.

    Counts seconds inside ``fit`` (of them, validation's, and the first batches' where torch.compile compiles
    again in each command), optimizer steps, epochs, images seen, and each command's wall time and code (so the
    record of a run resumed on other code says so)."""

    def __init__(self):
        # totals of the earlier commands this run resumed from
        self.before = {"training_seconds": 0.0, "train_images": 0, "wall_seconds": 0.0, "commands": 0,
                       "first_batches_seconds": 0.0, "validation_seconds": 0.0, "trees": []}
        self.started = self.stopped = None
        self.trainer = None
        self.first_batches, self.batch_started, self.timed = 0.0, None, set()
        self.validating, self.validation = None, 0.0

    def on_train_start(self, trainer, pl_module):
        self.trainer, self.first_step = trainer, trainer.global_step
        self.global_batch = trainer.datamodule.batch_size * trainer.accumulate_grad_batches
        self.started, self.stopped = time.perf_counter(), None
        self.first_batches, self.timed = 0.0, set()
        self.validating, self.validation = None, 0.0

    def on_validation_start(self, trainer, pl_module):
        if self.started is not None and not trainer.sanity_checking:
            self.validating = time.perf_counter()

    def on_validation_end(self, trainer, pl_module):
        if self.validating is not None:
            self.validation += time.perf_counter() - self.validating
            self.validating = None

    def _first_batch_start(self, trainer, kind: str) -> None:
        if self.started is not None and kind not in self.timed and not trainer.sanity_checking:
            self.batch_started = time.perf_counter()

    def _first_batch_end(self, kind: str) -> None:
        if self.batch_started is not None:
            self.first_batches += time.perf_counter() - self.batch_started
            self.timed.add(kind)
            self.batch_started = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._first_batch_start(trainer, "train")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._first_batch_end("train")

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._first_batch_start(trainer, "validation")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._first_batch_end("validation")

    def on_train_end(self, trainer, pl_module):
        self.stopped = time.perf_counter()

    def seconds(self) -> float:
        if self.started is None:
            return self.before["training_seconds"]
        return self.before["training_seconds"] + (self.stopped or time.perf_counter()) - self.started

    def validation_seconds(self) -> float:
        ongoing = time.perf_counter() - self.validating if self.validating is not None else 0.0
        return self.before["validation_seconds"] + self.validation + ongoing

    def train_seconds(self) -> float:
        """Seconds of the training epochs alone, without validation: TimeToAccuracy's clock."""
        return self.seconds() - self.validation_seconds()

    def wall(self) -> float:
        """Wall seconds of all the run's commands so far, start-up included."""
        return self.before["wall_seconds"] + wall_seconds()

    def state_dict(self) -> dict:
        if self.trainer is None:
            return dict(self.before)
        trainer = self.trainer
        per_epoch = max(1, trainer.num_training_batches // trainer.accumulate_grad_batches) \
            if trainer.num_training_batches not in (0, float("inf")) else 1
        seconds = self.seconds()
        images = self.before["train_images"] + (trainer.global_step - self.first_step) * self.global_batch
        return {"training_seconds": round(seconds, 3), "train_images": images, "steps": trainer.global_step,
                "epochs": round(trainer.global_step / per_epoch, 2),
                "train_images_per_second": round(images / seconds, 1) if seconds > 0 else None,
                "wall_seconds": round(self.before["wall_seconds"] + wall_seconds(), 1),
                "commands": self.before["commands"] + 1, "trees": [*self.before["trees"], code()],
                "validation_seconds": round(self.validation_seconds(), 3),
                "first_batches_seconds": round(self.before["first_batches_seconds"] + self.first_batches, 3)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.before = {**self.before, **state_dict}  # an older checkpoint may lack keys
        trees = self.before["trees"]
        self.before["trees"] = [code_of(t) for t in trees] if isinstance(trees, list) else []

    @property
    def state_key(self) -> str:
        return CLOCK  # the key checkpoints keep it under


class TimeToAccuracy(L.Callback):
    """Log the training seconds at which ``val/acc`` first reaches each threshold (``time_to/val_acc_<t>``) and
    the wall seconds (``time_to/wall_val_acc_<t>``). Training seconds exclude validation, as speed records do."""

    def __init__(self, thresholds: tuple[float, ...] = (0.90, 0.93, 0.94)):
        self.thresholds = sorted(thresholds)
        self.reached: dict[float, float] = {}
        self.reached_wall: dict[float, float] = {}

    def state_dict(self):
        return {"reached": {str(t): s for t, s in self.reached.items()},
                "reached_wall": {str(t): s for t, s in self.reached_wall.items()}}

    def load_state_dict(self, state_dict):
        self.reached = {float(t): s for t, s in state_dict.get("reached", {}).items()}
        self.reached_wall = {float(t): s for t, s in state_dict.get("reached_wall", {}).items()}

    def on_validation_epoch_end(self, trainer, pl_module):
        acc = trainer.callback_metrics.get("val/acc")
        if trainer.sanity_checking or acc is None:
            return
        clock = next(cb for cb in trainer.callbacks if isinstance(cb, TrainingClock))
        acc = acc.item()  # one host sync per validation
        for t in self.thresholds:
            if t not in self.reached and acc >= t:
                self.reached[t], self.reached_wall[t] = clock.train_seconds(), clock.wall()
                rank_zero_info(f"val/acc {acc:.4f} >= {t:.2f} after {self.reached[t]:.1f} s of training "
                               f"({self.reached_wall[t]:.1f} s wall; epoch {trainer.current_epoch}, "
                               f"step {trainer.global_step})")
        if self.reached:
            pl_module.log_dict({f"time_to/val_acc_{t:.2f}": s for t, s in self.reached.items()})
            pl_module.log_dict({f"time_to/wall_val_acc_{t:.2f}": s for t, s in self.reached_wall.items()})


class WandbSamplePredictions(L.Callback):
    """At the end of each validation, log a table of sample images with label, prediction, confidence."""

    def __init__(self, num_samples: int = 16):
        self.num_samples = num_samples
        self._batch = None

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if batch_idx == 0 and trainer.is_global_zero and wandb_logger(trainer.loggers):
            n = self.num_samples
            self._batch = (batch[0][:n].cpu(), batch[1][:n].cpu(), outputs[:n].float().softmax(-1).cpu())

    def on_validation_epoch_end(self, trainer, pl_module):
        logger = wandb_logger(trainer.loggers)
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
    """Every ``every_n_epochs`` validations, log attention rollout of the first validation images to W&B."""

    def __init__(self, num_images: int = 4, every_n_epochs: int = 5):
        self.num_images, self.every_n_epochs = num_images, every_n_epochs

    def on_validation_epoch_end(self, trainer, pl_module):
        logger = wandb_logger(trainer.loggers)
        if (trainer.sanity_checking or not trainer.is_global_zero or logger is None
                or trainer.current_epoch % self.every_n_epochs):
            return
        from vit.models.rollout import explain
        from vit.models.visualize import overlay, upsample

        val_set = trainer.datamodule.val_set
        images = torch.stack([val_set[i][0] for i in range(min(self.num_images, len(val_set)))])
        with torch.compiler.set_stance("force_eager"):  # rank 0 alone, a few images: don't compile
            probs, rollout = explain(pl_module.eval_model, pl_module.normalize(images.to(pl_module.device)))
        names = pl_module.class_names
        pictures = [overlay(img, upsample(r.cpu(), *img.shape[-2:])) for img, r in zip(images, rollout)]
        captions = [f"{names[p.argmax()]} ({p.max():.2f})" for p in probs.cpu()]
        logger.log_image(key="val/rollout", images=pictures, caption=captions)


def batch_size(batch) -> int:
    return batch[0].size(0)


class Throughput(L.Callback):
    """Log training samples/s, FLOP/s and MFU as Lightning's ThroughputMonitor does, over about ``window_size``
    steps, validation excluded. It syncs the GPU only at logging steps: Lightning's monitor syncs every batch,
    which costs a GPU-bound step its overlap with the next."""

    def __init__(self, window_size: int = 100):
        self.window_size = window_size

    def on_train_start(self, trainer, pl_module):
        from lightning.fabric.utilities.throughput import Throughput as Measure, get_available_flops

        precision = str(trainer.precision)
        dtype = (torch.bfloat16 if "bf16" in precision else torch.float16 if precision.startswith("16") else
                 torch.float64 if precision.startswith("64") else torch.float32)
        points = max(2, self.window_size // max(1, trainer.log_every_n_steps) + 1)
        self.measure = Measure(available_flops=get_available_flops(pl_module.device, dtype),
                               world_size=trainer.world_size, window_size=points, separator="/")
        self.started, self.samples, self.batches, self.measured = time.perf_counter(), 0, 0, 0
        self.measure.update(time=0.0, batches=0, samples=0, flops=0)

    def on_validation_start(self, trainer, pl_module):
        self.validating = time.perf_counter()

    def on_validation_end(self, trainer, pl_module):  # validation's time is not training's
        if hasattr(self, "started") and getattr(self, "validating", None) is not None:
            self.started += time.perf_counter() - self.validating
        self.validating = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        from vit.training.agreement import check_step

        self.samples += batch_size(batch)
        self.batches += 1
        if not check_step(trainer):
            return
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        self.measure.update(time=time.perf_counter() - self.started, batches=self.batches, samples=self.samples,
                            flops=pl_module.flops_per_batch * (self.batches - self.measured))
        self.measured = self.batches
        metrics = {f"train/{k}": v for k, v in self.measure.compute().items()}
        if metrics and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)


class LogConfig(SaveConfigCallback):
    """LightningCLI's config.yaml in the run folder, and the whole resolved config in the W&B run's config."""

    def save_config(self, trainer, pl_module, stage) -> None:
        wandb = wandb_logger(trainer.loggers)
        if wandb is not None:
            import yaml

            wandb.experiment.config.update(yaml.safe_load(self.parser.dump(self.config, skip_none=False)),
                                           allow_val_change=True)


class WandbRunId(L.Callback):
    """Store the W&B run id, the launch (a SLURM job) and the digest of the command (``runs.command_id``) in every
    checkpoint, so that a resume logs into the same W&B run and a requeued command knows its own checkpoints."""

    def __init__(self, command: str | None = None):
        self.command = command

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        from vit.cluster.launch import launch_name

        wandb = wandb_logger(trainer.loggers)
        checkpoint.setdefault("vit", {}).update(wandb_run_id=wandb.version if wandb else None, launch=launch_name(),
                                                command=self.command)


def run_callbacks(trainer: dict, configured: list, step_checkpoint_minutes: float | None,
                  stop_after_minutes: float | None, stuck_seconds: float,
                  command: str | None = None) -> list[L.Callback]:
    """Every run's own callbacks (watchdog, exact resume, stops, clock, agreement of the processes, ...),
    attached here and nowhere else; a recipe lists only optional ones."""
    from pathlib import Path

    from lightning.pytorch.callbacks import LearningRateMonitor, Timer
    from lightning.pytorch.callbacks import ModelSummary as LightningModelSummary
    from lightning.pytorch.callbacks import ProgressBar as LightningProgressBar

    from vit.cluster import runs
    from vit.training.agreement import Agreement
    from vit.training.guards import StopAfterMinutes, StopOnNonFinite, StopOnSignal, Watchdog
    from vit.training.progress import ModelSummary, ProgressBar
    from vit.data.resume import DataSplit, RNGStates, StepCheckpoint, StepEndTimer
    from vit.data.seeding import EpochSeed

    # order matters: Agreement after StopOnNonFinite (its flag) and TrainingClock (a preemption checkpoint's count)
    callbacks = [Watchdog(stuck_seconds), EpochSeed(), RNGStates(), DataSplit(), StopOnNonFinite(),
                 TrainingClock(), StopOnSignal(), Agreement(), WandbRunId(command)]
    if trainer.get("logger", True) not in (False, []):
        callbacks.append(LearningRateMonitor("step"))
    if trainer.get("enable_progress_bar") is not False and \
            not any(isinstance(c, LightningProgressBar) for c in configured):
        callbacks.append(ProgressBar())
    if trainer.get("enable_model_summary") is not False and \
            not any(isinstance(c, LightningModelSummary) for c in configured):
        callbacks.append(ModelSummary())
    if step_checkpoint_minutes:
        callbacks.append(StepCheckpoint(Path(trainer.get("default_root_dir")) / runs.CHECKPOINTS,
                                        step_checkpoint_minutes))
    if stop_after_minutes:
        callbacks.append(StopAfterMinutes(stop_after_minutes))
    if trainer.get("max_time") is not None and not any(isinstance(c, Timer) for c in configured):
        callbacks.append(StepEndTimer(trainer["max_time"]))  # stops at a step's end; replaces Lightning's Timer
    return callbacks
