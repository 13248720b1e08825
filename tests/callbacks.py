"""Callbacks the training tests add through the CLI (`--trainer.callbacks+=callbacks.StopAfterEpoch`)."""

import lightning as L


class StopAfterEpoch(L.Callback):
    """Stop cleanly after epoch ``epoch`` (0-based), as a job hitting its time limit would."""

    def __init__(self, epoch: int = 0):
        self.epoch = epoch

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch >= self.epoch:
            trainer.should_stop = True


class PoisonAtEpoch(L.Callback):
    """Make the weights non-finite at the start of epoch ``epoch``, as a diverging run would."""

    def __init__(self, epoch: int = 1):
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch:
            import torch

            with torch.no_grad():
                pl_module.model.head.weight.fill_(float("inf"))


class PoisonGradientAtStep(L.Callback):
    """Make a gradient non-finite before optimizer step ``step`` (its loss finite), as an overflow would."""

    def __init__(self, step: int = 2):
        self.step = step

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if trainer.global_step == self.step:
            next(p for p in pl_module.parameters() if p.grad is not None).grad.view(-1)[0] = float("nan")


class HoldAtStep(L.Callback):
    """At the end of optimizer step ``step``, each process writes ``<run>/held.<rank>`` and waits there
    (``seconds`` at most) until it got SIGUSR1 (``until="signal"``: vit's StopOnSignal noted it) or until
    ``<run>/go`` exists (``until="go"``), so that a test acts while the run is at a known step, on any machine.
    Only in a job's first attempt (SLURM_RESTART_COUNT unset or 0): a requeued one goes on."""

    def __init__(self, step: int = 2, until: str = "signal", seconds: float = 300):
        self.step, self.until, self.seconds = step, until, seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        import os
        import time
        from pathlib import Path

        from vit.training.guards import StopOnSignal

        if trainer.global_step != self.step or os.environ.get("SLURM_RESTART_COUNT", "0") != "0":
            return
        run = Path(trainer.default_root_dir)
        (run / f"held.{trainer.global_rank}").write_text(f"{time.time()}\n")
        (stop,) = [c for c in trainer.callbacks if isinstance(c, StopOnSignal)]
        deadline = time.monotonic() + self.seconds
        while not (stop.signalled if self.until == "signal" else (run / "go").exists()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"HoldAtStep: nothing came within {self.seconds} s")
            time.sleep(0.05)


class StallRank(L.Callback):
    """Rank ``rank`` stops answering for ``seconds``, as a stuck or desynchronised process: after epoch 0, or
    (``in_validation``) after its second validation batch in epoch 0, while the others go on to the
    validation's end and wait there for it in a collective. It first writes the time into
    ``<run>/stalled.<rank>``."""

    def __init__(self, rank: int = 1, seconds: float = 25, in_validation: bool = False):
        self.rank, self.seconds, self.in_validation = rank, seconds, in_validation

    def stall(self, trainer) -> None:
        if trainer.global_rank == self.rank and trainer.current_epoch == 0 and not trainer.sanity_checking:
            import time
            from pathlib import Path

            (Path(trainer.default_root_dir) / f"stalled.{self.rank}").write_text(f"{time.time()}\n")
            time.sleep(self.seconds)

    def on_train_epoch_end(self, trainer, pl_module):
        if not self.in_validation:
            self.stall(trainer)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if self.in_validation and batch_idx == 1:
            self.stall(trainer)


class StopDataWorkers(L.Callback):
    """At step ``step``, every DataLoader worker of this process stops (SIGSTOP): alive, and never answering
    again, as a worker stuck on a lock its fork copied mid-use. It then writes the time into
    ``<run>/stopped.<rank>``."""

    def __init__(self, step: int = 2):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            import multiprocessing
            import os
            import signal
            import time
            from pathlib import Path

            for worker in multiprocessing.active_children():
                os.kill(worker.pid, signal.SIGSTOP)
            (Path(trainer.default_root_dir) / f"stopped.{trainer.global_rank}").write_text(f"{time.time()}\n")


class RaiseMidTraining(L.Callback):
    """A user's callback with a bug: raises ``error`` (a built-in exception type's name) with ``message`` at step 2."""

    def __init__(self, error: str = "ValueError", message: str = "a bug in the user's callback"):
        self.error, self.message = error, message

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 2:
            raise getattr(__import__("builtins"), self.error)(self.message)


class CrashAtStep(L.Callback):
    """The process dies at the end of step ``step``, before that step's checkpoints: with ``kill``, by
    SIGKILL (as `kill -9`, a lost node or the out-of-memory killer), else by an exception. Under torchrun,
    only the process of rank ``rank`` (None: any), and only in torchrun's first attempt."""

    def __init__(self, step: int = 5, kill: bool = True, rank: int | None = None):
        self.step, self.kill, self.rank = step, kill, rank

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        import os
        import signal

        if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
            return
        if trainer.global_step == self.step and self.rank in (None, trainer.global_rank):

            if self.kill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"crashed at step {self.step}")


class CrashInValidation(L.Callback):
    """The run crashes in epoch ``epoch``'s validation: after the epoch's last step, before its end-of-epoch
    checkpoints."""

    def __init__(self, epoch: int = 0):
        self.epoch = epoch

    def on_validation_start(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch and not trainer.sanity_checking:
            raise RuntimeError(f"crashed in the validation of epoch {self.epoch}")


class CountSteps(L.Callback):
    """Each optimizer step executed, one line per step in ``<run>/steps.<rank>``, over every attempt."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        from pathlib import Path

        with open(Path(trainer.default_root_dir) / f"steps.{trainer.global_rank}", "a") as f:
            f.write(f"{trainer.global_step}\n")


class RecordBatches(L.Callback):
    """Each training step's images as this process saw them: one line per step in ``<run>/batches.<rank>``,
    the step, then per image its label and the sum of its pixels (sorted), over every attempt."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        from pathlib import Path

        images, labels = batch
        pairs = sorted(f"{int(y)}:{int(x.long().sum())}" for x, y in zip(images, labels))
        with open(Path(trainer.default_root_dir) / f"batches.{trainer.global_rank}", "a") as f:
            f.write(f"{trainer.global_step} {' '.join(pairs)}\n")


class FillDisk(L.Callback):
    """At the start of epoch ``epoch``, a file beside the run folder fills its file system to the last byte,
    as another job's output or a quota would: the run's next write fails with ENOSPC."""

    def __init__(self, epoch: int = 1):
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module):
        import errno
        from pathlib import Path

        if trainer.current_epoch != self.epoch:
            return
        with open(Path(trainer.default_root_dir).parent / "filler", "wb", buffering=0) as f:
            chunk = 1 << 20
            while chunk:  # to the last byte: smaller and smaller writes
                try:
                    f.write(b"\0" * chunk)
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e
                    chunk //= 2


class RaiseAtStep(L.Callback):
    """What the environment raises in the middle of a run, at step ``step``: torch's out-of-memory error, a bad
    input (DatasetError), a bug (KeyError), or NCCL's watchdog timeout as it reaches the main thread (TORCH_NCCL_ASYNC_ERROR_HANDLING=2). Under DDP,
    only on the process of rank ``rank`` (None: every one), which first writes the time into
    ``<run>/raised.<rank>``."""

    def __init__(self, error: str = "oom", step: int = 2, rank: int | None = None):
        self.error, self.step, self.rank = error, step, rank

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        import time
        from pathlib import Path

        import torch

        if trainer.global_step != self.step or self.rank not in (None, trainer.global_rank):
            return
        (Path(trainer.default_root_dir) / f"raised.{trainer.global_rank}").write_text(f"{time.time()}\n")
        if self.error == "dataset":  # a bad input that only this process read
            from vit.exits import DatasetError

            raise DatasetError("data/cifar-10-batches-py/data_batch_3 is truncated: re-download CIFAR-10")
        if self.error == "bug":  # a bug of this process's own (a user's callback, a dataset's code)
            raise KeyError("label")
        if self.error == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                                         "capacity of 79.19 GiB of which 1.02 GiB is free.")
        raise torch.distributed.DistBackendError(
            "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE, "
            "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600021 milliseconds before timing out.")


class SignalAtBatch(L.Callback):
    """At the end of the run's training batch number ``batch`` (from 1, over the run, whichever optimizer step it
    is in: inside an accumulation window too), the process gets ``signal``: SIGKILL (as `kill -9`), or SIGUSR1
    (what SLURM sends before a time limit)."""

    def __init__(self, batch: int = 5, signal: str = "SIGKILL"):
        self.batch, self.signal = batch, signal

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        import os
        import signal

        if trainer.fit_loop.epoch_loop.batch_progress.total.processed == self.batch:
            os.kill(os.getpid(), getattr(signal, self.signal))


class PauseAtBatch(L.Callback):
    """Sleep ``seconds`` after the run's training batch number ``batch`` (from 1, over the run), before the
    run's own callbacks see that batch: a time-driven step checkpoint then falls due there."""

    def __init__(self, batch: int = 5, seconds: float = 1.5):
        self.batch, self.seconds = batch, seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        import time

        if trainer.fit_loop.epoch_loop.batch_progress.total.processed == self.batch:
            time.sleep(self.seconds)


class BreakBatch(L.Callback):
    """When training starts, the image files of loader batch ``batch`` of epoch 0 on process ``rank`` (None: every
    process) become unreadable, as files removed or damaged after the run's setup check would: their training
    batch has no image to train on there."""

    def __init__(self, batch: int = 3, rank: int | None = None):
        self.batch, self.rank = batch, rank

    def on_train_start(self, trainer, pl_module):
        from vit.data.resume import DataPosition, EpochOrder

        if self.rank not in (None, trainer.global_rank):
            return
        subset, size = trainer.datamodule.train_set, trainer.datamodule.process_batch()
        order = EpochOrder(subset, size, trainer.datamodule.seed, DataPosition(), trainer.global_rank, trainer.world_size)
        picked = [index for index, _ in order][self.batch * size:(self.batch + 1) * size]
        for index in picked:
            with open(subset.dataset.samples[subset.indices[index]][0], "w") as f:
                f.write("no longer an image")


class RecordData(L.Callback):
    """The image folders as this process took them at its start (a resumed run's after its checkpoint was
    restored): ``<run>/data.<rank>``, a JSON list of the training images (in the order of the training set),
    the files skipped as unreadable, and the validation images."""

    def on_fit_start(self, trainer, pl_module):
        import json
        from pathlib import Path

        dm = trainer.datamodule
        train, val = dm.train_set, dm.val_set
        paths = [train.dataset.samples[i][0] for i in train.indices]
        held = [val.dataset.samples[i][0] for i in val.indices] if hasattr(val, "indices") else \
            [path for path, _ in val.samples]
        (Path(trainer.default_root_dir) / f"data.{trainer.global_rank}").write_text(
            json.dumps([paths, sorted(dm.bad_files), held]))


class StepEvents(L.Callback):
    """torch.profiler over the optimizer steps ``start`` + 1 to ``start`` + ``steps`` (as trainer.global_step counts
    them when each ends), each from its batch's start to the next one's (its callbacks, logging and checks
    included), and, per step, the collectives this process issued (vit.training.step_profile.collectives: the
    gradients' all-reduce, a broadcast, ...) and its host syncs: written as JSON into ``<run>/steps.<rank>.json``
    (``{step: {"collectives": {name: n}, "syncs": n}}``)."""

    def __init__(self, start: int = 2, steps: int = 12):
        self.start, self.steps, self.profiler, self.marks = start, steps, None, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        import torch

        step = trainer.global_step
        if step == self.start and self.profiler is None and not self.marks:
            self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.profiler.__enter__()
        if self.profiler is not None and step == self.start + self.steps:
            self.end(trainer)
        elif self.profiler is not None and step not in dict(self.marks):  # (a step's first batch)
            self.marks.append((step, f"vit-test step {step + 1}"))
            with torch.profiler.record_function(self.marks[-1][1]):
                pass

    def on_train_end(self, trainer, pl_module):
        if self.profiler is not None:
            self.end(trainer)

    def end(self, trainer) -> None:
        import json
        from collections import Counter
        from pathlib import Path

        from vit.training.step_profile import SYNC, collective

        self.profiler.__exit__(None, None, None)
        events = sorted(self.profiler.events(), key=lambda e: e.time_range.start)
        self.profiler, step, per_step = None, None, {}
        names = {name: s + 1 for s, name in self.marks}
        for event in events:
            if event.name in names:
                step = names[event.name]
                per_step[step] = {"collectives": Counter(), "syncs": 0}
            elif step is not None and collective(event.name):
                per_step[step]["collectives"][event.name] += 1
            elif step is not None and event.name == SYNC:
                per_step[step]["syncs"] += 1
        path = Path(trainer.default_root_dir) / f"steps.{trainer.global_rank}.json"
        path.write_text(json.dumps(per_step, indent=1))
