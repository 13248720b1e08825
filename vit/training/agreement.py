"""What every process of a run must decide alike while it trains, decided together at one set of steps: at the end
of every ``log_every_n_steps``-th optimizer step, where the loggers, the progress bar, the divergence guard and
Throughput read their values on the host (and so wait for the device there anyway), in one all-reduce of a few
numbers. The other steps issue no collective but the gradients' all-reduce, and read nothing on the host.

What is agreed, and whose it is:

- rank zero's training clock (--trainer.max_time's Timer): the clock the schedule reads until the next check
  (vit.training.schedule.shared_clock), and whether the time budget is spent (the run stops);
- whether rank zero's rolling step checkpoint is due (vit.data.resume.StepCheckpoint writes it);
- whether any process saw a non-finite loss or gradient (vit.training.guards.StopOnNonFinite: exit 3) or got
  SLURM's signal (vit.training.guards.StopOnSignal: the step checkpoint, then exit 4).

So a decision comes up to ``log_every_n_steps`` - 1 steps after its cause: the budget's stop, the step checkpoint
and a preemption's stop are that late, the learning rate's and the image size's time-based part moves at these
steps, and a divergence is caught there (or at the validation or epoch end before it: the guard looks there too).
Lightning's own per-batch broadcast of rank zero's SIGTERM (a collective and a host sync every step) is off: each
process ends at the end of the step in which it gets SIGTERM (Lightning's handling), and the others, which lose
it, end with exit 5 (vit.training.guards.Watchdog)."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import Timer

CLOCK, BUDGET, CHECKPOINT, DIVERGED, SIGNALLED = range(5)  # the agreed numbers, in this order


def check_step(trainer) -> bool:
    """Whether the batch just trained ended a check step: an optimizer step's end whose count is a multiple of
    ``log_every_n_steps`` (1 when logging is off: every step)."""
    from vit.data.resume import at_step_end

    return at_step_end(trainer) and trainer.global_step % max(1, trainer.log_every_n_steps) == 0


class Agreement(L.Callback):
    """The one collective of a training step, at check steps (``check_step``): see the module's text. After the
    divergence guard among the run's callbacks (its flag of this step is on the device by then) and the training
    clock (a preemption's checkpoint holds this step's count)."""

    def __init__(self):
        self.clock: tuple[float, float] | None = None  # (training seconds, budget): rank zero's, at the last check
        self.checkpoint_due = False  # the step checkpoint is due at this step (read by StepCheckpoint)

    def on_train_start(self, trainer, pl_module):
        if trainer.world_size > 1:  # (Lightning's check of rank zero's SIGTERM before every batch: see above)
            trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.checkpoint_due = False
        if not check_step(trainer):
            return
        from vit.data.resume import StepCheckpoint
        from vit.training.guards import StopOnNonFinite, StopOnSignal

        guard, signal, checkpoint, timer = (next((c for c in trainer.callbacks if isinstance(c, kind)), None)
                                            for kind in (StopOnNonFinite, StopOnSignal, StepCheckpoint, Timer))
        values = torch.zeros(5, dtype=torch.float64, device=trainer.strategy.root_device)
        if trainer.is_global_zero:  # rank zero's alone (the others add zeros)
            if timer is not None and timer.time_remaining() is not None:
                elapsed = timer.time_elapsed()
                values[CLOCK], values[BUDGET] = elapsed, elapsed + timer.time_remaining()
            values[CHECKPOINT] = checkpoint is not None and checkpoint.due()
        if guard is not None and hasattr(guard, "bad_step"):  # any process's (on the device: no host read here)
            values[DIVERGED] = guard.bad_step >= 0
        values[SIGNALLED] = signal is not None and signal.signalled
        if trainer.world_size > 1:
            torch.distributed.all_reduce(values)
        clock, budget, due, diverged, signalled = values.tolist()  # (the host reads: once, here)
        if diverged:
            guard.stop(trainer)
        if signalled and signal is not None:  # (outside a SLURM job: nothing; at an epoch's end: after it)
            signal.stop(trainer)
        if timer is not None and timer.time_remaining() is not None:
            self.clock = (clock, budget)
            if clock >= budget and not trainer.should_stop:
                trainer.should_stop = True
                from lightning.pytorch.utilities import rank_zero_info

                rank_zero_info(f"Time limit reached: {clock:.0f} s of training. Signaling Trainer to stop.")
        self.checkpoint_due = bool(due)
