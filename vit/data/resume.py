"""Exact resume from any step, mid-epoch included. Beyond Lightning's checkpoint, a mid-epoch resume needs:

- the data position, in images the training loop consumed (not what workers prefetched), so any split of the
  same global batch resumes at the same image; a place no split reaches exactly, or inside an optimizer
  step, is refused before training;
- a seeded order: each sample's augmentation is seeded by (seed, epoch, position in the epoch's order);
- every process's RNG states (dropout, Mixup, ...), set again before the next step.

The position is the datamodule's state because Lightning restores loaders only after making the first iterator.
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
    """The epoch and first batch of each new train iterator, and the position saved in a checkpoint. Epochs are
    counted here because Lightning makes a fit's first iterator before restoring its epoch counter. Skipped
    (unreadable) batches are recorded: the loader's position is the loop's batches plus those skipped before."""

    def __init__(self):
        self.epochs = 0  # iterators made
        self.epoch = 0  # the newest iterator's epoch
        self.resume_at: tuple[int, int, int] | None = None  # (epoch, image, skipped images) to resume at
        self.batches = 0  # the newest iterator's length, skipped batches included
        self.yielded = 0  # batches the newest iterator has given the loop
        self.skipped: list[int] = []  # ``yielded`` at each skipped batch

    def begin(self, batches: int, batch_images: int) -> tuple[int, int]:
        """(epoch, first batch) of a new iterator. A mid-epoch place that is not a whole number of batches is
        refused, never rounded down (``check_position`` refuses it earlier; this is the last guard)."""
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
        """The position in images (all processes together). ``epoch_end`` is needed because Lightning's own
        last-batch flag is not set when the loader skipped the epoch's final batches."""
        consumed = consumed_batches(trainer) if trainer is not None else 0
        end = trainer is not None and consumed > 0 and at_epoch_end(trainer) or \
            self.batches > 0 and consumed + len(self.skipped) >= self.batches
        skipped = len(self.skipped) if end else sum(1 for yielded in self.skipped if yielded < consumed)
        return {"train_epochs": self.epochs, "epoch": self.epoch, "images": (consumed + skipped) * batch_images,
                "skipped_images": skipped * batch_images, "batch_images": batch_images, "step_images": step_images,
                "epoch_end": end}

    def load_state_dict(self, state: dict) -> None:
        self.epochs = state.get("train_epochs", 0)
        self.resume_at = None  # at an epoch's end the next iterator starts the next epoch
        if state.get("epoch_end") is not True and "images" in state:
            self.resume_at = (state["epoch"], state["images"], state["skipped_images"])


def check_global_batch(ckpt: dict, datamodule, accumulate: int, name: str | None = None) -> None:
    """Refuse, before training, a resume that changes the global batch (batch size × accumulation), which would
    change the steps per epoch, the learning-rate scaling and the schedule; a split of it must reach the
    checkpoint's place in the data exactly (``check_position``)."""
    state = ckpt.get(type(datamodule).__qualname__) or {}
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
    """Whether a checkpoint's data position is inside its epoch (neither record says the epoch ended)."""
    if position <= 0 or state.get("epoch_end") is True:
        return False
    progress = ckpt.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress", {})
    return progress.get("is_last_batch") is not True


def check_position(ckpt: dict, state: dict, batch: int, name: str) -> None:
    """Refuse a mid-epoch place that is inside an optimizer step, or not a whole number of this run's loader
    batches of ``batch`` images (the resumed epoch would start a batch early). A step's end fits every split of
    the global batch unless skipped unreadable batches shifted it. Older checkpoints may lack the counts."""
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
    fits = math.gcd(images, skipped, step)  # batch sizes dividing this reach the place and split the step
    raise ConfigError(f"{name}: its place in the data is image {images} of epoch {state.get('epoch')}, after "
                      f"{skipped // theirs} unreadable loader batch(es) of {theirs} images it skipped, which this "
                      f"run's loader batches of {batch} images (--data.batch_size {batch}) do not reach: resume it "
                      f"with a --data.batch_size that divides {fits} and --data.batch_size × "
                      f"--trainer.accumulate_grad_batches = {step}, e.g. as it was written: --data.batch_size "
                      f"{theirs} --trainer.accumulate_grad_batches {step // theirs}")


def refuse_inside_step(name: str, done: int, per_step: int, batch: int, position: int, unit: str, epoch) -> None:
    """Refuse a checkpoint written inside an optimizer step (by a validation or a stop there): it holds the
    weights before the step but not the gradients of its first ``done`` batches, so no resume continues it."""
    from pathlib import Path

    step = Path(name).with_name("step.ckpt")
    raise ConfigError(f"{name}: written inside an optimizer step, after {done} of its {per_step} loader batches of "
                      f"{batch} images ({unit} {position} of epoch {epoch}: a validation or a stop there wrote it), "
                      f"and a checkpoint holds no gradients summed before it, so no split resumes it exactly: resume "
                      f"from a checkpoint written at a step's end (--ckpt_path {step} where the run has one, or an "
                      f"epoch's end)")


def batch_images(trainer) -> int | None:
    """Images per training loader batch, all processes together (None if the data module is not ours)."""
    datamodule = trainer.datamodule
    if datamodule is None or not hasattr(datamodule, "process_batch"):
        return None
    return datamodule.process_batch() * trainer.world_size


class DataSplit(L.Callback):
    """Convert a checkpoint's batch counters (Lightning's loop and ``RNGStates``') to this run's loader batches
    when the same global batch is split otherwise, so epochs, steps and checkpoints end where they would have."""

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        datamodule = trainer.datamodule
        state = checkpoint.get(type(datamodule).__qualname__) if datamodule is not None else None
        theirs, mine = (state or {}).get("batch_images"), batch_images(trainer)
        if not theirs or not mine or theirs == mine:
            return
        progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress")
        for counts in (progress.get(key) or {} for key in ("current", "total")) if progress else ():
            done = counts.get("processed", 0)
            shift = done * theirs // mine - done  # keeps the counters' differences
            for key in counts:
                counts[key] += shift
        rng = checkpoint.get("callbacks", {}).get(RNGStates.__qualname__)
        if isinstance(rng, dict) and "batches" in rng:
            rng["batches"] = rng["batches"] * theirs // mine
        rank_zero_info(f"resumed with {mine} images per loader batch (all processes together) from a checkpoint "
                       f"of {theirs}: the same global batch, split otherwise; the data continues at the same image")


class EpochOrder(DistributedSampler):
    """Yields (index, sample seed) from a per-epoch seeded permutation, sharded by rank. Subclasses
    DistributedSampler so that Lightning does not replace it under DDP."""

    def __init__(self, dataset, batch_size: int, seed: int, position: DataPosition, rank: int = 0,
                 world_size: int = 1, accumulate: int = 1):
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.batch_size, self.position, self.accumulate = batch_size, position, accumulate

    def __len__(self) -> int:
        """Samples of this rank, in whole optimizer steps."""
        step = self.batch_size * self.accumulate
        return len(self.dataset) // self.num_replicas // step * step

    def __iter__(self):
        epoch, start = self.position.begin(len(self) // self.batch_size, self.batch_size * self.num_replicas)
        order = torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(epoch_seed(self.seed, epoch)))
        order = order.tolist()  # plain ints: no tensor indexing per image
        for i in range(start * self.batch_size, len(self)):
            position = self.rank + self.num_replicas * i
            yield order[position], sample_seed(self.seed, epoch, position)


class SeededSamples(Dataset):
    """``dataset[index]`` transformed under the sample's seed, leaving the caller's RNG state untouched."""

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
    """Saves every process's RNG states and sets them again before the resumed step. Every process must call
    ``state_dict`` (it issues an all-gather)."""

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
    """Whether the step just taken was the epoch's last (a step checkpoint there would skip its validation)."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    return consumed_batches(trainer) >= trainer.num_training_batches or progress.is_last_batch


def at_step_end(trainer) -> bool:
    """Whether the batch just trained ended an optimizer step (a checkpoint inside one loses its gradients)."""
    return consumed_batches(trainer) % trainer.accumulate_grad_batches == 0 or at_epoch_end(trainer)


class StepCheckpoint(ModelCheckpoint):
    """``<run>/checkpoints/step.ckpt``, rewritten every ``minutes`` at a step where all processes agree it is
    due (rank zero's clock). Never at an epoch's last step, where it would skip the validation."""

    def __init__(self, dirpath, minutes: float):
        from vit.cluster.runs import STEP

        super().__init__(dirpath=dirpath, filename=STEP.removesuffix(".ckpt"), enable_version_counter=False,
                         every_n_train_steps=1)  # saves whenever asked; on_train_batch_end decides
        self.seconds, self.saved = 60 * minutes, None

    def on_train_start(self, trainer, pl_module):
        super().on_train_start(trainer, pl_module)
        self.saved = time.monotonic()

    def due(self) -> bool:
        """Whether ``minutes`` have passed since the last save (rank zero's answer is used)."""
        return self.saved is not None and time.monotonic() - self.saved >= self.seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # found by attribute, not imported: the agreement lives in a higher layer
        agreement = next((c for c in trainer.callbacks if hasattr(c, "checkpoint_due")), None)
        if agreement is not None and agreement.checkpoint_due and not at_epoch_end(trainer):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            self.saved = time.monotonic()


class StepEndTimer(Timer):
    """Lightning's Timer (``--trainer.max_time``), checked only at agreed check steps. Lightning checks after
    every batch, in a collective, and could stop inside an accumulation window, writing an unresumable
    checkpoint. Keeps the Timer's state key so elapsed time resumes either way."""

    def __init__(self, duration):
        super().__init__(duration=duration, interval="step")

    @property
    def state_key(self) -> str:
        return Timer.__qualname__

    def on_train_batch_end(self, trainer, *args, **kwargs):
        pass  # the agreement stops the run


def check_validation_interval(every, k: int) -> None:
    """Refuse a validation interval that falls inside an optimizer step of ``k`` batches (unresumable)."""
    if k == 1 or every is None or (isinstance(every, float) and every == 1.0) or \
            (isinstance(every, int) and not isinstance(every, bool) and every % k == 0):
        return
    example = k * max(1, every // k) if isinstance(every, int) else k
    raise ConfigError(f"--trainer.val_check_interval {every} validates inside an optimizer step of "
                      f"--trainer.accumulate_grad_batches {k} batches, and a checkpoint written there resumes in "
                      f"no split: validate every multiple of {k} batches (e.g. --trainer.val_check_interval "
                      f"{example}), or at epochs' ends")
