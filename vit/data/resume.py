"""Exact resume from any step, mid-epoch included. Lightning's checkpoint holds the weights, optimizer, lr
scheduler, loops and callbacks' states; a step checkpoint also needs each process's position in its data
and its RNG states, which live here.

- **Data.** Every random draw of a training sample depends only on (data seed, epoch, the sample's position
  in the epoch's order): ``EpochOrder`` yields (index, seed) pairs from a seeded permutation, sharded by
  rank, and ``SeededSamples`` applies the per-image augmentation under that seed, in whichever worker. A
  resumed epoch starts at the first batch the loop had not consumed (``DataPosition``, the datamodule's
  state in the checkpoint), counted in images, so that any split of the same global batch resumes there
  (``DataSplit``); the device pipeline (vit.data.device_data) does the same per batch. The position is what the
  training loop consumed, not what the loader produced: workers and Lightning's prefetching run ahead of
  training. A resume whose split cannot reach that place exactly, or from a place inside an optimizer step,
  is refused before training, never rounded down (``check_global_batch``).
- **The training process's own draws** (dropout, stochastic depth, token dropping, Mixup/CutMix, random
  erasing): ``RNGStates`` keeps every process's torch, CUDA, numpy and python RNG states in each
  checkpoint and sets them again right before the step after the one the checkpoint was taken at.

Epoch boundaries need neither: vit.data.seeding.EpochSeed seeds each epoch from (run seed, epoch, rank).
Lightning restores stateful loaders only after it has made the first iterator (our ``configure_optimizers``
asks for the run's length), so the position is the datamodule's state, restored before that.
"""

from __future__ import annotations

import random
import time

import lightning as L
import numpy as np
from lightning.pytorch.callbacks import ModelCheckpoint, Timer
from lightning.pytorch.utilities import rank_zero_info
import torch
from torch.utils.data import Dataset, DistributedSampler

from vit.exits import ConfigError
from vit.data.seeding import epoch_seed


def sample_seed(seed: int, epoch: int, position: int) -> int:
    """The seed of the augmentation of the sample at ``position`` of epoch ``epoch``'s order."""
    return (epoch_seed(seed, epoch) * 2_654_435_761 + position) % 2**63


def consumed_batches(trainer) -> int:
    """Training batches of the current epoch that the loop has finished (its step done)."""
    return trainer.fit_loop.epoch_loop.batch_progress.current.processed


class DataPosition:
    """Which epoch a new train iterator is, and its first batch. Epochs are counted as iterators are made
    (Lightning makes the first one of a fit before it restores its own epoch counter); a checkpoint taken
    mid-epoch makes the next iterator continue that epoch after the images the loop consumed, counted in
    images of the epoch's order (all processes together), so that a run resumed with another split of the
    same global batch (per-process batch × accumulation × processes) continues at the same image. A loader
    that skips batches (vit.data.datamodules.SkipUnreadable) notes, for each one it skips, how many it had given the loop
    before (``skipped``): the loader's position is the loop's consumed batches plus the ones skipped before
    them."""

    def __init__(self):
        self.epochs = 0  # iterators made
        self.epoch = 0  # the newest iterator's epoch
        self.resume_at: tuple[int, int, int] | None = None  # (epoch, image, of them skipped) of a mid-epoch checkpoint
        self.batches = 0  # the newest iterator's length, in loader batches (skipped ones included)
        self.yielded = 0  # batches the newest iterator has given the loop, counted as the loop counts its epoch
        self.skipped: list[int] = []  # of the newest iterator's skipped batches, ``yielded`` when each was skipped

    def begin(self, batches: int, batch_images: int) -> tuple[int, int]:
        """(epoch, first batch) of a new iterator over ``batches`` batches of ``batch_images`` images each (all
        processes together). A mid-epoch position that is not a whole number of those batches is refused, never
        rounded down (vit-train refuses it before training: ``check_position``; this is the last guard)."""
        resume, self.resume_at = self.resume_at, None
        if resume is not None:
            epoch, position, skipped = resume
            if 0 < position < batches * batch_images and (position % batch_images or skipped % batch_images):
                among = f" ({skipped} of them in skipped batches)" if skipped else ""
                raise ConfigError(f"the checkpoint's place in the data, image {position} of epoch {epoch}{among}, is "
                                  f"not a whole number of this run's loader batches of {batch_images} images: resume "
                                  f"it with the --data.batch_size and --trainer.accumulate_grad_batches it was "
                                  f"written with")
            start, skipped = position // batch_images, skipped // batch_images
        if resume is not None and 0 < start < batches:
            self.epoch = epoch
        else:
            self.epoch, start, skipped = self.epochs, 0, 0
            self.epochs += 1
        self.yielded, self.skipped = start - skipped, [-1] * skipped  # (those skipped before the resumed batch)
        self.batches = batches
        return self.epoch, start

    def state_dict(self, trainer, batch_images: int, step_images: int) -> dict:
        """The position in images; ``batch_images``: images per loader batch, all processes together;
        ``step_images``: the global batch (images per optimizer step), which a resumed run must keep;
        ``epoch_end``: whether the loader has nothing left of its epoch (its batches all trained or skipped), which
        the resumed run then starts anew (Lightning's own record of an epoch's last batch is not kept where the
        loader skipped the batches at its end)."""
        consumed = consumed_batches(trainer) if trainer is not None else 0
        end = trainer is not None and consumed > 0 and at_epoch_end(trainer) or \
            self.batches > 0 and consumed + len(self.skipped) >= self.batches
        skipped = len(self.skipped) if end else sum(1 for yielded in self.skipped if yielded < consumed)
        return {"train_epochs": self.epochs, "epoch": self.epoch, "images": (consumed + skipped) * batch_images,
                "skipped_images": skipped * batch_images, "batch_images": batch_images, "step_images": step_images,
                "epoch_end": end}

    def load_state_dict(self, state: dict) -> None:
        self.epochs = state.get("train_epochs", 0)
        self.resume_at = None  # (at an epoch's end the next iterator starts the next epoch; vit-train resumes no
        if state.get("epoch_end") is not True and "images" in state:  # checkpoint without images: check_fields)
            self.resume_at = (state["epoch"], state["images"], state["skipped_images"])


def check_global_batch(ckpt: dict, datamodule, accumulate: int, name: str | None = None) -> None:
    """A resume that keeps the checkpoint's global batch (images per optimizer step: --data.batch_size ×
    --trainer.accumulate_grad_batches), split in any way that reaches its place in the data exactly; another
    one is refused in one line, before training (a changed global batch would change the steps of an epoch, the
    learning rate's scaling and the schedule mid-run; a place between two loader batches would be rounded down
    to the start of a batch, and the run would train on other images than the uninterrupted run's)."""
    state = ckpt.get(type(datamodule).__qualname__) or {}  # (as written: vit.models.checkpoints.check_fields)
    batch = getattr(datamodule, "batch_size", None)
    batch = batch if isinstance(batch, int) else None
    name = name or "the checkpoint"
    theirs = state.get("step_images")
    if theirs is None or batch is None:
        return
    if theirs != batch * accumulate:
        raise ConfigError(f"{name}: written with a global batch of {theirs} images per optimizer step, and this "
                          f"run's is {batch * accumulate} (--data.batch_size {batch} × "
                          f"--trainer.accumulate_grad_batches {accumulate}): resume with --data.batch_size × "
                          f"--trainer.accumulate_grad_batches = {theirs}, split as you like, or start a new run")
    check_position(ckpt, state, batch, name)


def mid_epoch(ckpt: dict, state: dict, position: int) -> bool:
    """Whether a checkpoint's data position (anything but 0) is inside its epoch: not where its data position
    records that the loader had finished the epoch (``DataPosition.state_dict``), nor where Lightning's loop
    records that the last batch it took was the epoch's last (without either record, mid-epoch)."""
    if position <= 0 or state.get("epoch_end") is True:
        return False
    progress = ckpt.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress", {})
    return progress.get("is_last_batch") is not True


def check_position(ckpt: dict, state: dict, batch: int, name: str) -> None:
    """A mid-epoch checkpoint's place in the data (``DataPosition``: images of the epoch's order, all processes
    together, and of them those of skipped batches) must be where an optimizer step ended (``refuse_inside_step``)
    and a whole number of this run's loader batches of ``batch`` images (--data.batch_size: each process's share
    × the processes, as vit.data.datamodules.split_batch has checked before this), or the resumed epoch would start at the
    batch before it. Step checkpoints and the stop at a signal are written at a step's end: a multiple of the
    global batch, which fits every split of it, unless the loader skipped unreadable batches
    (vit.data.datamodules.SkipUnreadable) of fewer images than this run's before it. Refused in one line naming the splits
    that fit. Its counts are as written (vit.models.checkpoints.check_fields); an earlier version's may be missing."""
    import math

    images, skipped, theirs = state.get("images"), state.get("skipped_images", 0), state.get("batch_images")
    step = state.get("step_images")
    if None in (images, skipped, theirs, step) or not theirs or not mid_epoch(ckpt, state, images):
        return
    if (images - skipped) % step:
        refuse_inside_step(name, (images - skipped) % step // theirs, step // theirs, theirs, images, "image",
                           state.get("epoch"))
    if images % batch == 0 and skipped % batch == 0:
        return
    fits = math.gcd(images, skipped, step)  # (the loader batches that reach both counts and split the step)
    raise ConfigError(f"{name}: its place in the data is image {images} of epoch {state.get('epoch')}, after "
                      f"{skipped // theirs} unreadable loader batch(es) of {theirs} images it skipped, which this "
                      f"run's loader batches of {batch} images (--data.batch_size {batch}) do not reach: resume it "
                      f"with a --data.batch_size that divides {fits} and --data.batch_size × "
                      f"--trainer.accumulate_grad_batches = {step}, e.g. as it was written: --data.batch_size "
                      f"{theirs} --trainer.accumulate_grad_batches {step // theirs}")


def refuse_inside_step(name: str, done: int, per_step: int, batch: int, position: int, unit: str, epoch) -> None:
    """A checkpoint written inside an optimizer step, ``done`` of its ``per_step`` loader batches trained: a
    validation or a stop there wrote it (vit-train refuses such a --trainer.val_check_interval and stops for
    --trainer.max_time at steps' ends; Lightning's own Timer, and other versions, did not). It holds the
    weights before the step and not the gradients summed over those batches, so no split continues it exactly
    (resumed as written, the step trains on its other batches' gradients alone): refused, never resumed to
    other weights without a word."""
    from pathlib import Path

    step = Path(name).with_name("step.ckpt")
    raise ConfigError(f"{name}: written inside an optimizer step, after {done} of its {per_step} loader batches of "
                      f"{batch} images ({unit} {position} of epoch {epoch}: a validation or a stop there wrote it), "
                      f"and a checkpoint holds no gradients summed before it, so no split resumes it exactly: resume "
                      f"from a checkpoint written at a step's end (--ckpt_path {step} where the run has one, or an "
                      f"epoch's end)")


def batch_images(trainer) -> int | None:
    """Images per training loader batch, all processes together, of this run's data module (None: not one of
    ours)."""
    datamodule = trainer.datamodule
    if datamodule is None or not hasattr(datamodule, "process_batch"):
        return None
    return datamodule.process_batch() * trainer.world_size


class DataSplit(L.Callback):
    """A checkpoint written with another split of the same global batch (another per-process batch,
    accumulation or number of processes) counts its epoch's progress in its own loader batches: Lightning's
    training loop's batch counters (the checkpoint's ``loops.fit_loop.epoch_loop.batch_progress``: vit.private_api)
    and RNGStates' are turned into this run's before they are restored, so that the loop ends the epoch, steps the optimizer and checkpoints where the
    uninterrupted run does. The data's own position is in images (``DataPosition``)."""

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        datamodule = trainer.datamodule
        state = checkpoint.get(type(datamodule).__qualname__) if datamodule is not None else None
        theirs, mine = (state or {}).get("batch_images"), batch_images(trainer)
        if not theirs or not mine or theirs == mine:
            return
        progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress")
        for counts in (progress.get(key) or {} for key in ("current", "total")) if progress else ():
            done = counts.get("processed", 0)
            shift = done * theirs // mine - done  # (keeps the counters' differences)
            for key in counts:
                counts[key] += shift
        rng = checkpoint.get("callbacks", {}).get(RNGStates.__qualname__)
        if isinstance(rng, dict) and "batches" in rng:
            rng["batches"] = rng["batches"] * theirs // mine
        rank_zero_info(f"resumed with {mine} images per loader batch (all processes together) from a checkpoint "
                       f"of {theirs}: the same global batch, split otherwise; the data continues at the same image")


class EpochOrder(DistributedSampler):
    """Each epoch a permutation seeded with (seed, epoch), the same on every rank; rank r takes positions
    r, r + world, …, in whole batches. Yields (index, sample seed) for ``SeededSamples``. A
    DistributedSampler, so that Lightning leaves it in place under DDP."""

    def __init__(self, dataset, batch_size: int, seed: int, position: DataPosition, rank: int = 0,
                 world_size: int = 1, accumulate: int = 1):
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.batch_size, self.position, self.accumulate = batch_size, position, accumulate

    def __len__(self) -> int:
        """Whole optimizer steps of ``accumulate`` batches: the images a batch ``accumulate`` times larger
        would take, in the same order."""
        step = self.batch_size * self.accumulate
        return len(self.dataset) // self.num_replicas // step * step

    def __iter__(self):
        epoch, start = self.position.begin(len(self) // self.batch_size, self.batch_size * self.num_replicas)
        order = torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(epoch_seed(self.seed, epoch)))
        order = order.tolist()  # (plain ints: no tensor indexing per image)
        for i in range(start * self.batch_size, len(self)):
            position = self.rank + self.num_replicas * i
            yield order[position], sample_seed(self.seed, epoch, position)


class SeededSamples(Dataset):
    """``dataset[index]`` with the CPU RNG seeded by the sample's seed for its transform, the caller's RNG
    state left as it was (the training process's draws stay its own when num_workers is 0)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int]):
        index, seed = item
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)
            return self.dataset[index]


def rng_states() -> dict:
    """This process's RNG states, in plain types and tensors (checkpoints load with weights_only=True)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None,
            "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
            "python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss}}


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    if states["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])
    n = states["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = states["python"]
    random.setstate((p["version"], tuple(p["internal"].tolist()), p["gauss"]))


class RNGStates(L.Callback):
    """Every process's RNG states in each checkpoint (gathered from all processes: every process writes
    the checkpoint's state together, so each issues the one all-gather), set again before the first step
    of the resumed run when that continues the checkpoint's epoch at the same batch."""

    def __init__(self):
        self.pending: dict | None = None
        self._trainer = None

    def state_dict(self) -> dict:
        trainer = self._trainer
        mine = rng_states()
        states = [mine]
        if trainer is not None and trainer.world_size > 1 and torch.distributed.is_initialized():
            states = [None] * trainer.world_size
            torch.distributed.all_gather_object(states, mine)
        epoch = trainer.current_epoch if trainer is not None else 0
        return {"epoch": epoch, "batches": consumed_batches(trainer) if trainer is not None else 0, "states": states}

    def load_state_dict(self, state_dict: dict) -> None:
        self.pending = state_dict

    def setup(self, trainer, pl_module, stage):
        self._trainer = trainer

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        pending, self.pending = self.pending, None
        if not (pending and (pending["epoch"], pending["batches"]) == (trainer.current_epoch, consumed_batches(trainer))):
            return
        if len(pending["states"]) == trainer.world_size:
            if pending["batches"] > 0:
                set_rng_states(pending["states"][trainer.global_rank])
            return
        rank_zero_info(f"resumed on {trainer.world_size} process(es) from a checkpoint of {len(pending['states'])}: "
                       f"the data continues at the same image with the same augmentations (the global batch "
                       f"is the same); each process's own random draws (dropout, stochastic depth, token "
                       f"dropping, Mixup/CutMix pairs, random erasing) are drawn anew from seeds of (epoch, rank)")


def at_epoch_end(trainer) -> bool:
    """Whether the step just taken was the epoch's last (the loader's last batch: fewer than its length where
    it skipped some): its end-of-epoch checkpoints follow, after the validation. A step checkpoint there would
    be resumed as a finished epoch and skip that validation."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    return consumed_batches(trainer) >= trainer.num_training_batches or progress.is_last_batch


def at_step_end(trainer) -> bool:
    """Whether the batch just trained ended an optimizer step: the last batch of an accumulation window
    (``--trainer.accumulate_grad_batches``), or of the epoch. A checkpoint or a stop inside a window would
    lose the gradients summed so far; at a window's end, the consumed batches and the RNG states saved are
    those the resumed run continues from."""
    return consumed_batches(trainer) % trainer.accumulate_grad_batches == 0 or at_epoch_end(trainer)


class StepCheckpoint(ModelCheckpoint):
    """The rolling step checkpoint: ``<run>/checkpoints/step.ckpt``, rewritten every ``minutes`` of
    training by rank zero's clock, mid-epoch, at the end of a check step, where every process agrees that it is
    due (vit.training.agreement: every log_every_n_steps optimizer steps, never inside an accumulation window);
    never at an epoch's last step (it is due again at the next check)."""

    def __init__(self, dirpath, minutes: float):
        from vit.cluster.runs import STEP

        super().__init__(dirpath=dirpath, filename=STEP.removesuffix(".ckpt"), enable_version_counter=False,
                         every_n_train_steps=1)  # (each step it is asked to: when the processes agree it is due)
        self.seconds, self.saved = 60 * minutes, None

    def on_train_start(self, trainer, pl_module):
        super().on_train_start(trainer, pl_module)
        self.saved = time.monotonic()

    def due(self) -> bool:
        """Whether ``minutes`` have passed since training started or this last wrote (rank zero's is agreed)."""
        return self.saved is not None and time.monotonic() - self.saved >= self.seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # the agreement (vit.training.agreement.Agreement, a layer above: found by what it holds, not imported)
        agreement = next((c for c in trainer.callbacks if hasattr(c, "checkpoint_due")), None)
        if agreement is not None and agreement.checkpoint_due and not at_epoch_end(trainer):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            self.saved = time.monotonic()


class StepEndTimer(Timer):
    """Lightning's Timer (``--trainer.max_time``), whose clock is looked at only at check steps, where every
    process takes rank zero's (vit.training.agreement: every log_every_n_steps optimizer steps). The Trainer's
    own looks after every batch, in a collective, and a stop inside an accumulation window validates and writes
    its checkpoints there: without the gradients summed so far, no split resumes them exactly (vit-train refuses
    them). Its state is kept under the Timer's key, so the elapsed time of a run resumes either way."""

    def __init__(self, duration):
        super().__init__(duration=duration, interval="step")

    @property
    def state_key(self) -> str:
        return Timer.__qualname__

    def on_train_batch_end(self, trainer, *args, **kwargs):
        pass  # (vit.training.agreement.Agreement stops the run)


def check_validation_interval(every, k: int) -> None:
    """A validation inside an optimizer step writes checkpoints that no split resumes (``refuse_inside_step``):
    with --trainer.accumulate_grad_batches ``k``, --trainer.val_check_interval ``every`` must be a number of
    batches that is a multiple of k, or 1.0 (each epoch's end); a fraction of an epoch or a time is refused,
    before training."""
    if k == 1 or every is None or (isinstance(every, float) and every == 1.0) or \
            (isinstance(every, int) and not isinstance(every, bool) and every % k == 0):
        return
    example = k * max(1, every // k) if isinstance(every, int) else k
    raise ConfigError(f"--trainer.val_check_interval {every} validates inside an optimizer step of "
                      f"--trainer.accumulate_grad_batches {k} batches, and a checkpoint written there resumes in "
                      f"no split: validate every multiple of {k} batches (e.g. --trainer.val_check_interval "
                      f"{example}), or at epochs' ends")
