"""What stops a run early: divergence (exit 3), SLURM preemption and --stop_after_minutes (exit 4). Each stop
is decided at a step or epoch boundary that every process reaches, by a collective all of them issue. A stuck
process cannot take part in a collective, so a watchdog thread ends it (exit 5)."""

from __future__ import annotations

import faulthandler
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path

import lightning as L
import torch
from vit.cluster.launch import FAILED, READ
from vit.exits import LostProcesses, Preempted, TrainingDiverged, status_of
from vit.training.graphs import graph
from vit.training.loggers import wandb_logger


class Watchdog(L.Callback):
    """Ends a process (exit 5, printing every thread's stack) that starts or finishes no batch for ``seconds``:
    stuck in a loader worker, a read, or a collective waiting for a stuck peer. Otherwise a lone process waits
    forever, and under DDP it is killed silently once the others' collectives time out (``BACKSTOP`` later).
    Runs in its own thread, which the stuck waits (queue, socket, collective) leave free by releasing the GIL.

    Slow work gets ``SLOW`` seconds (or ``seconds`` if longer): a stage's start (model setup, checkpoint restore),
    every torch.compile compile, and a first batch of a new shape or image size through its optimizer step. A
    process waiting there for another's longer compile is still bounded by the process group's timeout
    (``seconds`` + ``BACKSTOP``): compile times that differ by more end the run with exit 5.

    Under DDP a process failing for a known cause writes it to the process group's store
    (vit.cluster.launch.say_failure); the others' ``listen`` threads exit with the same status instead of waiting
    for a timeout."""

    BACKSTOP = 60.0
    SLOW = 3600.0  # a compile, a stage's start
    POLL = 1.0  # how often the others' store is read
    GRACE = 3.0  # time for a process failing for the same cause to end by itself

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.stopped: threading.Event | None = None  # made in setup, so the callback stays picklable
        self.store = None
        self.seen: set = set()  # batch kinds and shapes already compiled
        self.window: tuple[str, int] | None = None  # (slow work, batches left) of a first batch's optimizer step
        self.alive()

    def alive(self, *args, slow: str | None = None, **kwargs) -> None:
        """Progress: restart the clock, with ``SLOW`` seconds while doing ``slow`` work."""
        self.clock = (time.monotonic(), max(self.seconds, self.SLOW) if slow else self.seconds, slow)

    on_validation_batch_end = on_test_batch_end = alive
    on_fit_start = on_validation_start = on_test_start = alive  # a stage's start is over

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batch_starts("training", batch, getattr(pl_module, "train_image_size", None),
                          trainer.accumulate_grad_batches)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # a first batch's slow time lasts to its optimizer step, whose all-reduce waits for peers' compiles
        self.window = (self.window[0], self.window[1] - 1) if self.window and self.window[1] > 1 else None
        self.alive(slow=self.window and self.window[0])

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self.batch_starts("validation", batch)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self.batch_starts("test", batch)

    def batch_starts(self, kind: str, batch, image_size: int | None = None, batches_per_step: int = 1) -> None:
        parts = batch if isinstance(batch, (list, tuple)) else [batch]
        key = (kind, tuple((tuple(t.shape), t.dtype) for t in parts if isinstance(t, torch.Tensor)), image_size)
        at = f" at {image_size} px" if image_size else ""
        slow = None if key in self.seen else f"its first {kind} batch of this shape{at} (where torch.compile compiles)"
        self.seen.add(key)
        if kind == "training":  # evaluation batches have no optimizer step to wait for
            self.window = (slow, batches_per_step) if slow else self.window
            slow = self.window and self.window[0]
        self.alive(slow=slow)

    def compiles(self, *args) -> None:  # a compile starts (torch 2.14 passes its id, older releases nothing)
        self.before = self.clock[2]
        self.alive(slow="a torch.compile compile")

    def compiled(self, *args) -> None:  # a compile ends: back to the batch's own limit
        self.alive(slow=self.before)

    def setup(self, trainer, pl_module, stage):
        self.alive(slow="its start (the model's setup and weights, a checkpoint's restore)")
        self.rank, self.stopped = trainer.global_rank, threading.Event()
        self.before = None
        torch._dynamo.callback_handler.register_start_callback(self.compiles)
        torch._dynamo.callback_handler.register_end_callback(self.compiled)
        threading.Thread(target=self.watch, args=(self.stopped,), name="vit-watchdog", daemon=True).start()
        if self.store is None and trainer.world_size > 1:
            from vit.cluster.launch import peers_store

            self.store = peers_store()
        if self.store is not None:
            threading.Thread(target=self.listen, args=(self.stopped,), name="vit-peers", daemon=True).start()

    def teardown(self, trainer, pl_module, stage=None):
        if self.stopped is not None:
            self.stopped.set()
        handler = torch._dynamo.callback_handler
        if self.compiles in handler.start_callbacks:
            handler.remove_start_callback(self.compiles)
            handler.remove_end_callback(self.compiled)

    def on_exception(self, trainer, pl_module, exception):  # Lightning calls no teardown then
        self.teardown(trainer, pl_module)

    def watch(self, stopped: threading.Event) -> None:
        while (left := (clock := self.clock)[0] + clock[1] - time.monotonic()) > 0:
            if stopped.wait(min(left, self.POLL)):  # poll: a slow period's end shortens the limit
                return
        _, limit, slow = clock
        what = f"{slow} took over {limit:g} s" if slow else f"no batch started or finished in {limit:g} s"
        allow = f"a --ddp_timeout over {limit:g}" if slow else "--ddp_timeout"
        stream = sys.__stderr__
        print(f"error: process {self.rank}: {what}: it is stuck, or waits in a collective for a process that is "
              f"(that one says where it is). Where each of its threads is follows. Resume with --ckpt_path last; "
              f"allow slower steps with {allow}.", file=stream, flush=True)
        faulthandler.dump_traceback(file=stream, all_threads=True)
        stream.flush()
        os._exit(status_of(LostProcesses()))

    def listen(self, stopped: threading.Event) -> None:
        """Under DDP: end this process, with the same status, when another says that it failed."""
        from torch.distributed import DistError

        while not stopped.wait(self.POLL):
            try:
                if not self.store.check([FAILED]):
                    continue
                status, rank, line = self.store.get(FAILED).decode().split("\t", 2)
            except DistError:  # rank 0, the store's host, is gone: the collectives report it
                return
            if int(rank) == self.rank or stopped.wait(self.GRACE):  # this process ends by itself
                return
            try:
                self.store.add(READ, 1)
            except DistError:
                pass
            print(f"error: process {self.rank}: process {rank} failed, and this one stopped with it instead of "
                  f"waiting for it: {line}", file=sys.__stderr__, flush=True)
            os._exit(int(status))


def watch(loss: torch.Tensor, norm: torch.Tensor, bad_step: torch.Tensor, last_finite: torch.Tensor,
          step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first step whose loss or gradient norm is not finite (-1: none yet), and the last finite loss."""
    finite = torch.isfinite(loss) & torch.isfinite(norm)
    bad_step = torch.where((bad_step < 0) & ~finite, step, bad_step)
    return bad_step, torch.where((bad_step < 0) & finite, loss, last_finite)


class StopOnNonFinite(L.Callback):
    """Stop with ``TrainingDiverged`` when the loss or the gradient norm (the one clipping takes) is non-finite.
    Tracked on the device each step, with no host sync; the host checks, all processes together, at check
    steps, before validation and at epoch end, so no checkpoint is written after a bad step."""

    def __init__(self):
        self.restored_loss = math.nan  # the last finite loss of the run this one resumes

    def state_dict(self):
        return {"last_finite_loss": float(self.last_finite) if hasattr(self, "last_finite") else math.nan}

    def load_state_dict(self, state_dict):
        self.restored_loss = state_dict.get("last_finite_loss", math.nan)

    def on_train_start(self, trainer, pl_module):
        device = pl_module.device
        self.bad_step = torch.full((), -1, dtype=torch.long, device=device)
        self.last_finite = torch.full((), self.restored_loss, device=device)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = (outputs["loss"] if isinstance(outputs, dict) else outputs).detach().float()
        # not under fp16, whose grad scaler skips inf steps by design
        norm = getattr(pl_module, "grad_norm", None)
        norm = loss if norm is None or str(trainer.precision).startswith("16") else norm.float()
        # compiled with the model; dynamic, so a new step number does not recompile
        step = graph(watch, bool(pl_module.hparams.get("compile")), dynamic=True)
        self.bad_step, self.last_finite = step(loss, norm, self.bad_step, self.last_finite, trainer.global_step - 1)

    def on_validation_start(self, trainer, pl_module):
        if hasattr(self, "bad_step"):
            self.check(trainer)

    def on_train_epoch_end(self, trainer, pl_module):
        self.check(trainer)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        """A model with non-finite weights is never saved (``check`` has said why training stopped)."""
        if not all(torch.isfinite(p).all() for p in pl_module.parameters()):
            raise TrainingDiverged(f"training diverged by step {trainer.global_step} (epoch {trainer.current_epoch}): "
                                   "the weights are not finite; no checkpoint was written")

    def check(self, trainer) -> None:
        if trainer.strategy.reduce_boolean_decision(bool(self.bad_step >= 0), all=False):
            self.stop(trainer)

    def stop(self, trainer) -> None:
        """A process saw a non-finite value (every process stops alike)."""
        step, last = int(self.bad_step), float(self.last_finite)
        where = f"at step {step}" if step >= 0 else "on another process"
        last = f"last finite loss {last:.4f}" if math.isfinite(last) else "no finite loss before it"
        raise TrainingDiverged(
            f"training diverged {where} (epoch {trainer.current_epoch}): the loss or the gradients became "
            f"non-finite ({last}). Try a lower --model.optimizer.lr, a longer --model.schedule.warmup_epochs, "
            f"or --trainer.precision 32-true. The checkpoints written before are kept; no test was run.")


class StopOnSignal(L.Callback):
    """On SLURM's SIGUSR1 (a time limit or preemption is near), save the step checkpoint and stop (exit 4) at a
    step boundary all processes agree on; the requeued job resumes exactly. The handler only notes the signal:
    Lightning's own (turned off) saves mid-step inside the handler, a DDP deadlock (Lightning #21406)."""

    def __init__(self):
        self.job = None
        self.signalled = False
        self.after_epoch: int | None = None  # signalled at an epoch's last step: stop after its checkpoints

    def setup(self, trainer, pl_module, stage):
        from vit.cluster.launch import slurm_job

        self.job = slurm_job() if stage == "fit" else None
        if self.job and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, self._note)

    def _note(self, signum, frame):
        self.signalled = True

    def stop(self, trainer) -> None:
        """Save and stop; at an epoch's last step, let the epoch's validation and checkpoints run first and stop
        as the next epoch starts."""
        from vit.cluster.runs import CHECKPOINTS, STEP
        from vit.data.resume import at_epoch_end

        if not self.job:
            return
        if at_epoch_end(trainer):
            self.after_epoch = trainer.current_epoch
            return
        path = os.path.join(trainer.default_root_dir, CHECKPOINTS, STEP)
        started = time.perf_counter()
        trainer.save_checkpoint(path)  # every process: the checkpoint gathers each one's RNG states
        seconds = time.perf_counter() - started
        self._stopped(trainer, f"stopped at step {trainer.global_step}, in epoch {trainer.current_epoch}, and saved "
                               f"it to {path} ({seconds:.1f} s)")

    def on_train_epoch_start(self, trainer, pl_module):
        if self.after_epoch is not None:
            self._stopped(trainer, f"stopped at the end of epoch {self.after_epoch} (step {trainer.global_step}), "
                                   f"after its checkpoints")

    def _stopped(self, trainer, what: str) -> None:
        if trainer.is_global_zero and wandb_logger(trainer.loggers) is not None:
            import wandb

            if wandb.run is not None:
                wandb.run.mark_preempting()
        from vit.cluster.launch import requeuer

        by = requeuer()
        then = (f"Requeued by {by} under the same id, it resumes from there." if by else
                f"Requeued under the same id (scontrol requeue {self.job}, as scripts/slurm/train.sbatch does), "
                "it resumes from there.")
        raise Preempted(f"SLURM job {self.job} got SIGUSR1 (a time limit or preemption is near): {what}. {then}")


class StopAfterMinutes(L.Callback):
    """Stop after a validating epoch's checkpoints when the epochs to the next validation (+20 %, +30 s for the
    test) would end past ``minutes`` since the process started; exit 4, and ``--ckpt_path last`` resumes
    exactly. Rank zero's clock decides for all processes."""

    def __init__(self, minutes: float):
        self.limit = 60 * minutes
        self.stopped_at: int | None = None  # the epoch after which it stopped

    def on_train_epoch_start(self, trainer, pl_module):
        self.epoch_started = time.perf_counter()

    def on_validation_end(self, trainer, pl_module):  # before ModelCheckpoint's (Lightning runs those last)
        if trainer.sanity_checking or not hasattr(self, "epoch_started"):
            return
        epoch = time.perf_counter() - self.epoch_started
        # the next chance to stop is at the next validation
        late = wall_seconds() + 1.2 * epoch * (trainer.check_val_every_n_epoch or 1) + 30 > self.limit
        last = trainer.max_epochs not in (None, -1) and trainer.current_epoch + 1 >= trainer.max_epochs
        (late,) = [trainer.strategy.broadcast(late)]  # rank zero's clock decides for every process
        if late and not last:
            trainer.should_stop = True
            self.stopped_at = trainer.current_epoch


_IMPORTED = time.perf_counter()


def wall_seconds() -> float:
    """Seconds since this process started (Linux; elsewhere since this module was imported)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED
