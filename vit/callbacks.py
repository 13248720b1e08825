"""Callbacks of the training runs: exact resume, stopping honestly on divergence, time to accuracy,
and what W&B shows (sample predictions, attention rollout)."""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelSummary as LightningModelSummary
from lightning.pytorch.callbacks import ThroughputMonitor, TQDMProgressBar
from lightning.pytorch.callbacks.progress.progress_bar import get_standard_metrics
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_info

from vit.exits import Preempted, TrainingDiverged


class StopAfterMinutes(L.Callback):
    """End this command in time for a wall-clock limit on it (a lease, a short partition): at the end of
    an epoch, after its checkpoints, when one more epoch like the last (+20 %, + 30 s for the test) would
    end past ``minutes`` since the process started. The CLI then exits 4 (vit.commands.train), and
    ``--ckpt_path last`` continues the run exactly, its schedule and clock included. All processes
    decide together on rank zero's clock. Not when the run would end anyway with that epoch."""

    def __init__(self, minutes: float):
        self.limit = 60 * minutes
        self.stopped_at: int | None = None  # the epoch after which it stopped

    def on_train_epoch_start(self, trainer, pl_module):
        self.epoch_started = time.perf_counter()

    def on_validation_end(self, trainer, pl_module):  # before ModelCheckpoint's (Lightning runs those last)
        from vit.results import wall_seconds

        if trainer.sanity_checking or not hasattr(self, "epoch_started"):
            return
        epoch = time.perf_counter() - self.epoch_started
        late = wall_seconds() + 1.2 * epoch + 30 > self.limit
        last = trainer.max_epochs not in (None, -1) and trainer.current_epoch + 1 >= trainer.max_epochs
        (late,) = [trainer.strategy.broadcast(late)]  # rank zero's clock decides for every process
        if late and not last:
            trainer.should_stop = True
            self.stopped_at = trainer.current_epoch


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


class StopOnNonFinite(L.Callback):
    """Stop training with ``TrainingDiverged`` when the loss or the gradient norm becomes non-finite.

    Every step is watched on the device (the first bad step and the last finite loss are kept there,
    with no host sync); the host looks every ``every_n_steps`` steps, before each validation and at
    the end of each epoch, so a checkpoint is never written after a bad step (and the LightningModule
    refuses to save non-finite weights in any case). Under DDP all ranks decide together.
    """

    def __init__(self, every_n_steps: int = 1):
        self.every_n_steps = max(1, every_n_steps)
        self.restored_loss = math.nan  # the last finite loss of the run this one resumes

    def state_dict(self):
        return {"last_finite_loss": float(self.last_finite) if hasattr(self, "last_finite") else math.nan}

    def load_state_dict(self, state_dict):
        self.restored_loss = state_dict.get("last_finite_loss", math.nan)

    def on_train_start(self, trainer, pl_module):
        device = pl_module.device
        self.bad_step = torch.full((), -1, dtype=torch.long, device=device)
        self.last_finite = torch.full((), self.restored_loss, device=device)
        self.grads_finite = torch.ones((), dtype=torch.bool, device=device)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if str(trainer.precision).startswith("16"):  # fp16's grad scaler skips inf steps by design
            return
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        if grads:
            self.grads_finite = torch.isfinite(torch.nn.utils.get_total_norm(grads))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = (outputs["loss"] if isinstance(outputs, dict) else outputs).detach().float()
        finite = torch.isfinite(loss) & self.grads_finite
        first = (self.bad_step < 0) & ~finite
        self.bad_step = torch.where(first, trainer.global_step - 1, self.bad_step)
        self.last_finite = torch.where((self.bad_step < 0) & finite, loss, self.last_finite)
        if trainer.global_step % self.every_n_steps == 0:
            self.check(trainer)

    def on_validation_start(self, trainer, pl_module):
        if hasattr(self, "bad_step"):
            self.check(trainer)

    def on_train_epoch_end(self, trainer, pl_module):
        self.check(trainer)

    def check(self, trainer) -> None:
        if not trainer.strategy.reduce_boolean_decision(bool(self.bad_step >= 0), all=False):
            return
        step, last = int(self.bad_step), float(self.last_finite)
        where = f"at step {step}" if step >= 0 else "on another process"
        last = f"last finite loss {last:.4f}" if math.isfinite(last) else "no finite loss before it"
        raise TrainingDiverged(
            f"training diverged {where} (epoch {trainer.current_epoch}): the loss or the gradients became "
            f"non-finite ({last}). Try a lower --model.lr, a longer --model.warmup_epochs, "
            f"or --trainer.precision 32-true. The checkpoints written before are kept; no test was run.")


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
    return next((lg for lg in trainer.loggers if isinstance(lg, WandbLogger)), None)


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


class ModelSummary(LightningModelSummary):
    """Lightning's model summary without its FLOPs column, which counts only with an example input and
    shows 0 here; the notes' analytic count (vit.model.flops_per_image) is its total instead."""

    def on_fit_start(self, trainer, pl_module):
        from vit.model import flops_per_image

        self.flops = flops_per_image(pl_module.model.config)
        super().on_fit_start(trainer, pl_module)

    def summarize(self, summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                  total_flops, **kwargs) -> None:
        data = [column for column in summary_data if column[0] != "FLOPs"]
        super().summarize(data, total_parameters, trainable_parameters, model_size, total_training_modes,
                          self.flops, **kwargs)
        rank_zero_info("(Total Flops: of one image's forward pass at full size, the notes' count; a training "
                       "step costs 3× that per image)")


class LogConfig(SaveConfigCallback):
    """LightningCLI's config.yaml in the run folder, and the whole resolved config (trainer, callbacks,
    model, data) in the W&B run's config."""

    def save_config(self, trainer, pl_module, stage) -> None:
        wandb = _wandb(trainer)
        if wandb is not None:
            import yaml

            wandb.experiment.config.update(yaml.safe_load(self.parser.dump(self.config, skip_none=False)),
                                           allow_val_change=True)


class ProgressBar(TQDMProgressBar):
    """Lightning's TQDM bar in a terminal; anywhere else (a SLURM output file, a pipe) the bars are off,
    as Lightning turns them off on ranks > 0, and rank zero prints one plain line every
    ``every_n_steps`` training steps and one per validation instead: a bar's carriage returns flood log
    files (Lightning #6647).

    Either way it shows the values every process has already computed and never computes a metric
    itself: at an epoch's end that would be a synced metric's all-gather on rank zero alone, while the
    other ranks issue their next collective (a DDP deadlock; Lightning's own bar does exactly that)."""

    def __init__(self, refresh_rate: int = 1, every_n_steps: int | None = None, terminal: bool | None = None):
        """
        Args:
            refresh_rate: update the terminal bar every this many steps.
            every_n_steps: without a terminal, print a line every this many steps (default: the
                Trainer's log_every_n_steps).
            terminal: force the bar (True) or the lines (False); default: whether stderr is a terminal.
        """
        super().__init__(refresh_rate=refresh_rate)
        self.lines = not (sys.stderr.isatty() if terminal is None else terminal)
        if self.lines:
            self.disable()
        self.every_n_steps = every_n_steps
        self._started = time.perf_counter()

    def get_metrics(self, trainer, pl_module):
        computed = getattr(trainer._logger_connector, "_progress_bar_metrics", {})  # filled on every rank
        return {**get_standard_metrics(trainer), **computed}

    def _line(self, trainer, text: str, prefix: str) -> None:
        metrics = {k: v for k, v in self.get_metrics(trainer, trainer.lightning_module).items() if k.startswith(prefix)}
        shown = " ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())
        elapsed = time.perf_counter() - self._started
        print(f"[{elapsed:7.0f} s] {text} {shown}".rstrip(), file=sys.stderr, flush=True)

    def on_train_start(self, trainer, pl_module):
        self._started = time.perf_counter()
        super().on_train_start(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        every = self.every_n_steps or trainer.log_every_n_steps
        if self.lines and trainer.is_global_zero and (batch_idx + 1) % every == 0:
            total = self.total_train_batches
            of = f"/{total}" if isinstance(total, int) else ""
            self._line(trainer, f"epoch {trainer.current_epoch} batch {batch_idx + 1}{of} step {trainer.global_step}:", "train/")

    def on_validation_end(self, trainer, pl_module):
        super().on_validation_end(trainer, pl_module)
        if self.lines and trainer.is_global_zero and not trainer.sanity_checking:
            self._line(trainer, f"epoch {trainer.current_epoch} validation:", "val/")


class StopOnSignal(L.Callback):
    """Preemption on SLURM, handled where every process is at the same point: a step boundary.

    SLURM sends SIGUSR1 before a time limit or a preemption (``#SBATCH --signal=SIGUSR1@90``); the
    handler only notes it. Every ``every_n_steps`` steps all processes agree (one all-reduce) whether
    any of them got it; if so every process stops with ``Preempted`` (exit 4), writing nothing more, and
    scripts/slurm/train.sbatch requeues the job (same job id, same run folder). The requeued job resumes
    from the run's last.ckpt — the last completed epoch — and ends with exactly the weights of an
    uninterrupted job. (Lightning's own handler saves a checkpoint from inside the signal handler,
    issuing collectives in the middle of a step while the other ranks wait in backward: a deadlock,
    Lightning #21406; vit.commands.train turns it off.) Outside a SLURM job this does nothing."""

    def __init__(self, every_n_steps: int = 1):
        self.every_n_steps = max(1, every_n_steps)
        self.job = None
        self.signalled = False

    def setup(self, trainer, pl_module, stage):
        from vit.runs import slurm_job

        self.job = slurm_job() if stage == "fit" else None
        if self.job and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, self._note)

    def _note(self, signum, frame):
        self.signalled = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.job and trainer.global_step % self.every_n_steps == 0:
            self.check(trainer)

    def check(self, trainer) -> None:
        if not trainer.strategy.reduce_boolean_decision(self.signalled, all=False):
            return
        if trainer.is_global_zero and _wandb(trainer) is not None:
            import wandb

            if wandb.run is not None:  # the logger's run, if it started
                wandb.run.mark_preempting()
        last = os.path.join(trainer.default_root_dir, "checkpoints", "last.ckpt")
        resume = f"resumes from {last}" if os.path.isfile(last) else "starts again in its run folder (no epoch was completed)"
        raise Preempted(f"SLURM job {self.job} got SIGUSR1 (a time limit or preemption is near): stopped at step "
                        f"{trainer.global_step}, in epoch {trainer.current_epoch}. Requeued by "
                        f"scripts/slurm/train.sbatch under the same id, it {resume}.")
