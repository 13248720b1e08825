"""The run's schedule: how far the run is, and what follows from it — the learning rate (linear warmup by
steps, then a cosine) and the training image size (progressive resizing).

How far: warmup counts steps; then the share of the run done is the steps done over the total, or the
training seconds used over the time budget (``--trainer.max_time``), whichever is further, so that a run
cut off by the clock still ends its cosine at ``min_lr`` and passes every resize stage. Everything here
is a function of (step, elapsed, budget); its one piece of state, the training second at which warmup
ended, is kept in the checkpoint. Under DDP every process reads rank zero's clock (``shared_clock``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Schedule:
    """``warmup`` steps; then a cosine of ``decay`` steps (None: the length is the time budget alone);
    ``stages``: (image size, share of the run at which that size ends), then ``image_size``."""

    warmup: int
    decay: int | None
    image_size: int
    stages: tuple[tuple[int, float], ...] = ()
    warmup_end_time: float | None = None  # training seconds when warmup ended (time budgets)
    share: float = field(default=0.0)  # of the whole run, warmup included: picks the image size

    def advance(self, step: int, clock: tuple[float, float] | None = None) -> int:
        """The run is at ``step`` (and ``clock`` = (training seconds used, budget)); returns the cosine's
        position in updates, what timm's scheduler is stepped to, and sets ``share``."""
        length = self.warmup + (self.decay or 0)
        share = step / length if self.decay else 0.0
        done = (step - self.warmup) / self.decay if self.decay else 0.0
        if clock is not None:
            elapsed, budget = clock
            share = max(share, elapsed / budget)
            if step > self.warmup:
                if self.warmup_end_time is None:
                    self.warmup_end_time = elapsed
                done = max(done, (elapsed - self.warmup_end_time) / max(budget - self.warmup_end_time, 1e-9))
        self.share = min(share, 1.0)
        return step if step <= self.warmup else self.warmup + round(min(done, 1.0) * self.cosine_steps)

    @property
    def cosine_steps(self) -> int:
        """The cosine's length in timm's updates (a time budget without a step count: 10,000 slices)."""
        return self.decay if self.decay else 10_000

    def train_image_size(self) -> int:
        return next((size for size, end in self.stages if self.share < end), self.image_size)

    def state_dict(self) -> dict:
        return {"warmup_end_time": self.warmup_end_time, "share": self.share}

    def load_state_dict(self, state: dict) -> None:
        self.warmup_end_time = state.get("warmup_end_time")
        self.share = state.get("share", 0.0)


def check_stages(stages, image_size: int, patch_size: int) -> None:
    from vit.exits import ConfigError

    for size, _ in stages:
        if size % patch_size or size >= image_size:
            raise ConfigError(f"resize_stages: a stage's image size must be a multiple of the patch size "
                              f"{patch_size} below the image size {image_size}, got {size}")
    ends = [end for _, end in stages]
    if ends != sorted(set(ends)):
        raise ConfigError(f"resize_stages: the stages' ends must increase, got {ends}")


def shared_clock(trainer) -> tuple[float, float] | None:
    """(training seconds used, budget) of Lightning's Timer (``--trainer.max_time``; None without one),
    rank zero's on every process: one broadcast, issued by all of them, so that all step with the same lr
    and image size."""
    from lightning.pytorch.callbacks import Timer

    timer = next((cb for cb in trainer.callbacks if isinstance(cb, Timer)), None)
    if timer is None:
        return None
    elapsed = timer.time_elapsed()
    clock = (elapsed, elapsed + timer.time_remaining())
    return tuple(trainer.strategy.broadcast(clock)) if trainer.world_size > 1 else clock
