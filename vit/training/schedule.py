"""The run's schedule, built complete from the recipe when training starts: how far the run is, and what
follows from it — the learning rate (linear warmup by steps, then timm's cosine) and the
training image size (progressive resizing).

How far: warmup counts steps; then the share of the run done is the steps done over the total, or the
training seconds used over the time budget (``--trainer.max_time``), whichever is further, so that a run
cut off by the clock still ends its decay at ``min_lr`` and passes every resize stage. ``progress`` is a
pure function of (step, clock); its one piece of history, the training second at which warmup ended, is
kept in the checkpoint. Every process reads rank zero's clock, as all agreed on it at the last check step
(``shared_clock``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vit.exits import ConfigError

TIME_SLICES = 10_000  # the decay's length in timm's updates when the time budget alone gives the run's length


@dataclass(frozen=True)
class Progress:
    updates: int  # the lr's position, in timm's updates
    share: float  # of the whole run, warmup included: picks the image size
    warmup_end_time: float | None  # training seconds when warmup ended (time budgets)


def progress(step: int, clock: tuple[float, float] | None, warmup: int, decay: int | None,
             warmup_end_time: float | None) -> Progress:
    """Where the run is after ``step`` steps (and ``clock`` = (training seconds used, budget)): warmup by
    steps, then the decay by the further of steps and time."""
    length = warmup + (decay or 0)
    share = step / length if decay else 0.0
    done = (step - warmup) / decay if decay else 0.0
    if clock is not None:
        elapsed, budget = clock
        share = max(share, elapsed / budget)
        if step > warmup:
            if warmup_end_time is None:
                warmup_end_time = elapsed
            done = max(done, (elapsed - warmup_end_time) / max(budget - warmup_end_time, 1e-9))
    updates = step if step <= warmup else warmup + round(min(done, 1.0) * (decay or TIME_SLICES))
    return Progress(updates, min(share, 1.0), warmup_end_time)


def image_size(share: float, stages: tuple[tuple[int, float], ...], full: int) -> int:
    """The training image size at ``share`` of the run: the first stage not yet ended, else ``full``."""
    return next((size for size, end in stages if share < end), full)


@dataclass
class Schedule:
    """The run's schedule: ``warmup`` steps, then a decay of ``decay`` steps (None: the time budget alone
    gives the length); ``stages``: (image size, share of the run at which that size ends), then
    ``image_size``. Holds where the run is (``share``, ``warmup_end_time``: in every checkpoint)."""

    warmup: int
    decay: int | None
    image_size: int
    stages: tuple[tuple[int, float], ...] = ()
    warmup_end_time: float | None = None
    share: float = field(default=0.0)

    def advance(self, step: int, clock: tuple[float, float] | None = None) -> int:
        """The run is at ``step``: remember where, and return the lr's position in timm's updates."""
        p = progress(step, clock, self.warmup, self.decay, self.warmup_end_time)
        self.share, self.warmup_end_time = p.share, p.warmup_end_time
        return p.updates

    @property
    def cosine_steps(self) -> int:
        """The decay's length in timm's updates."""
        return self.decay if self.decay else TIME_SLICES

    def train_image_size(self) -> int:
        return image_size(self.share, self.stages, self.image_size)

    def lr_scheduler(self, optimizer, lr: float, min_lr: float):
        """timm's scheduler for this schedule (stepped by ``advance``'s updates): linear warmup from lr/1000,
        then the cosine to ``min_lr``."""
        from timm.scheduler import CosineLRScheduler

        return CosineLRScheduler(optimizer, t_initial=max(self.cosine_steps, 1), lr_min=min_lr, warmup_t=self.warmup,
                                 warmup_lr_init=lr * 1e-3 if self.warmup else lr, warmup_prefix=True, t_in_epochs=False)

    def state_dict(self) -> dict:
        return {"warmup_end_time": self.warmup_end_time, "share": self.share}

    def load_state_dict(self, state: dict) -> None:
        self.warmup_end_time = state.get("warmup_end_time")
        self.share = state.get("share", 0.0)


def for_run(trainer, warmup_epochs: float, image_size: int, stages, state: dict) -> tuple[Schedule, str]:
    """The schedule of the run ``trainer`` is about to train, complete: its warmup (``warmup_epochs`` of
    optimizer steps) and its length (the Trainer's steps, or its time budget, or both), from ``state`` (a
    resumed run's), and a description of its length for the run's first lines."""
    total = trainer.estimated_stepping_batches
    trainer.fit_loop.setup_data()  # (done already unless the run is open-ended) num_training_batches
    clock = shared_clock(trainer)
    finite = total != float("inf")
    if not finite and clock is None:
        raise ConfigError("set --trainer.max_epochs, --trainer.max_steps or --trainer.max_time: "
                          "the learning-rate schedule needs a length")
    per_epoch = max(1, trainer.num_training_batches // trainer.accumulate_grad_batches)
    warmup = int(round(warmup_epochs * per_epoch))
    if finite:
        warmup = min(warmup, int(total) - 1)
    schedule = Schedule(warmup, int(total) - warmup if finite else None, image_size, tuple(tuple(s) for s in stages))
    schedule.load_state_dict(state)
    length = f"step {int(total)}" if finite else ""
    if clock is not None:
        length = f"{length} or " * bool(length) + f"{clock[1]:.0f} s of training, whichever comes first"
    return schedule, length


def check_stages(stages, image_size: int, patch_size: int) -> None:
    for size, _ in stages:
        if size % patch_size or size >= image_size:
            raise ConfigError(f"resize_stages: a stage's image size must be a multiple of the patch size "
                              f"{patch_size} below the image size {image_size}, got {size}")
    ends = [end for _, end in stages]
    if ends != sorted(set(ends)):
        raise ConfigError(f"resize_stages: the stages' ends must increase, got {ends}")


def shared_clock(trainer) -> tuple[float, float] | None:
    """(training seconds used, budget) of Lightning's Timer (``--trainer.max_time``; None without one),
    rank zero's on every process, so that all step with the same lr and image size: as the processes agreed on
    it at the last check step (vit.training.agreement: every log_every_n_steps steps, no collective between
    them), and before the first, rank zero's now (one broadcast, issued by all of them)."""
    from lightning.pytorch.callbacks import Timer

    from vit.training.agreement import Agreement

    timer = next((cb for cb in trainer.callbacks if isinstance(cb, Timer)), None)
    if timer is None or timer.time_remaining() is None:
        return None
    agreement = next((cb for cb in trainer.callbacks if isinstance(cb, Agreement)), None)
    if agreement is not None and agreement.clock is not None:
        return agreement.clock
    elapsed = timer.time_elapsed()
    clock = (elapsed, elapsed + timer.time_remaining())
    clock = tuple(trainer.strategy.broadcast(clock)) if trainer.world_size > 1 else clock
    if agreement is not None:
        agreement.clock = clock
    return clock
