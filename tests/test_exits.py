"""Exit statuses as code (vit.exits): the table in docs/training.md is the code's, --help shows it, and a bug — ours or
a user's callback's, whatever its exception type — keeps its traceback (exit 1), never read as a bad input."""

import re
from pathlib import Path

import pytest

from vit import exits
from helpers import QUIET, train, train_here

ROOT = Path(__file__).resolve().parents[1]


def test_docs_exit_table_is_the_codes():
    text = (ROOT / "docs" / "training.md").read_text()
    block = re.search(r"<!-- exits -->\n(.*?)<!-- /exits -->", text, re.S)
    assert block and block.group(1) == exits.markdown()
    assert [e.status for e in exits.EXITS] == [0, 1, 2, 3, 4, 5, 6, 7]


def test_each_error_type_has_its_status_and_builtins_have_none():
    assert exits.status_of(exits.ConfigError("x")) == exits.status_of(exits.DatasetError("x")) == 2
    assert exits.status_of(exits.CheckpointError("x")) == exits.status_of(exits.RunError("x")) == 2
    assert exits.status_of(exits.TrainingDiverged("x")) == 3
    assert exits.status_of(exits.Preempted("x")) == exits.status_of(exits.Stopped("x")) == 4
    assert exits.status_of(exits.LostProcesses("x")) == 5
    assert exits.status_of(exits.AcceleratorUnusable("x")) == 2
    assert exits.status_of(exits.StorageFull("x")) == 6 and exits.status_of(exits.OutOfDeviceMemory("x")) == 7
    for bug in (ValueError("x"), FileNotFoundError("x"), KeyError("x"), RuntimeError("x"), TypeError("x")):
        assert exits.status_of(bug) is None


@pytest.mark.parametrize("error, status, message", [
    ("oom", 7, "error: the accelerator ran out of memory with 50 images per device (the global batch 50 split among "
               "the processes). Try --data.batch_size 25 --trainer.accumulate_grad_batches 2 (the same 50 images "
               "and lr per optimizer step, 25 per device at a time)"),
    ("nccl", 5, "error: process 0: lost the other processes of this run ([Rank 0] Watchdog caught collective "
                "operation timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE"),
])
def test_device_memory_and_nccl_timeouts_are_one_line(tmp_path, fake_cifar_session, capsys, error, status, message):
    """Simulated on CPU: the errors torch raises on a GPU (torch.OutOfMemoryError; NCCL's watchdog timeout,
    which reaches the main thread as DistBackendError with TORCH_NCCL_ASYNC_ERROR_HANDLING=2, set by every
    run that makes an NCCL group) reach the same one-line exits as on a GPU cluster."""
    code = train_here(tmp_path, fake_cifar_session, "--trainer.logger", "false", "--test_after_fit", "false",
                      "--trainer.callbacks+=callbacks.RaiseAtStep",
                      "--trainer.callbacks.error", error)
    err = capsys.readouterr().err
    assert code == status and message in err and "Traceback" not in err, err[-3000:]


def test_help_shows_the_exit_table(capsys):
    from vit.commands.train import main

    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "exit status (the same command: with --ckpt_path last, as train.sbatch runs it): 0 done 1 a bug" in out
    assert "5 a process is stuck or the processes of a multi-process run lost each other" in out
    assert "[same command resumes: yes]" in out


@pytest.mark.long  # the watchdog's exit 5 and its line: test_slow_work_that_outlasts_its_time_is_stuck_too
def test_a_stuck_data_worker_ends_the_run_with_exit_5_and_where_it_was(tmp_path, fake_cifar_session):
    """One process, the settings a user gets (W&B on, offline without credentials; the progress lines) but
    --ddp_timeout 10: its data loader's workers stop answering
    at step 2 (SIGSTOP). No batch comes; after 10 s the process prints one line and each thread's stack
    (the main thread waits in the DataLoader) and exits 5, instead of waiting forever."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from helpers import ROOT, TESTS, smoke_argv

    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"),
           *smoke_argv(fake_cifar_session, ("--data.num_workers", "2", "--ddp_timeout", "10",
                                            "--trainer.callbacks+=callbacks.StopDataWorkers"), quiet=False)]
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "WANDB_MODE")}
    env.update(PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT)]), PYTHONUNBUFFERED="1", WANDB_SILENT="true")
    with open(tmp_path / "err.txt", "w") as log:  # (a file: the stopped workers would hold a pipe open)
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=log,
                                start_new_session=True)
        try:
            proc.wait(timeout=240)
        finally:
            ended = time.time()
            os.killpg(proc.pid, signal.SIGKILL)  # the stopped workers, orphaned
    err = (tmp_path / "err.txt").read_text()
    assert proc.returncode == 5, err[-3000:]
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.startswith("error: process 0: no batch started or finished in 10 s: it is stuck"), line
    assert "Resume with --ckpt_path last" in line
    (main_thread,) = [block for block in err.split("\n\n") if 'scripts/train.py", line' in block]
    assert "torch/utils/data/dataloader.py" in main_thread and "in _get_data" in main_thread, err[-3000:]
    assert "Traceback" not in err
    stopped = float((tmp_path / "runs" / "smoke" / "version_0" / "stopped.0").read_text())
    assert ended - stopped < 60  # the watchdog's 10 s and the exit, not a wait without end


@pytest.mark.long
def test_a_users_callback_that_raises_mid_training_is_exit_1_with_its_traceback(tmp_path, fake_cifar_session):
    """The command as a user runs it: Python's exit 1 and the whole traceback, no error line."""
    proc = train(tmp_path, fake_cifar_session, "--trainer.callbacks+=callbacks.RaiseMidTraining",
                 "--trainer.callbacks.error=ValueError", "--trainer.logger", "false")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback (most recent call last)" in proc.stderr
    assert re.search(r"callbacks\.py\", line \d+, in on_train_batch_end", proc.stderr)
    assert "ValueError: a bug in the user's callback" in proc.stderr
    assert not [line for line in proc.stderr.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("error", ["ValueError", "FileNotFoundError", "KeyError"])
def test_a_users_callback_that_raises_mid_training_is_a_bug_main_does_not_catch(tmp_path, fake_cifar_session, error,
                                                                                capsys):
    """Whatever the built-in type, vit-train's main() lets it through with its traceback (this process)."""
    import builtins
    import threading
    import traceback

    with pytest.raises(getattr(builtins, error), match="a bug in the user's callback") as raised:
        train_here(tmp_path, fake_cifar_session, "--trainer.callbacks+=callbacks.RaiseMidTraining",
                   f"--trainer.callbacks.error={error}", "--trainer.logger", "false")
    (frame, *_) = reversed(traceback.extract_tb(raised.tb))
    assert frame.name == "on_train_batch_end" and frame.filename.endswith("callbacks.py")
    for thread in [t for t in threading.enumerate() if t.name == "vit-watchdog"]:  # disarmed by the exception
        thread.join(timeout=5)
        assert not thread.is_alive()
    assert not [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def test_a_bad_value_is_still_exit_2_with_one_line(tmp_path, capsys, monkeypatch):
    from vit.commands.train import main

    monkeypatch.chdir(tmp_path)
    assert main(["--config", "smoke", "--model.optimizer.lr", "-1", *QUIET]) == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        'error: Parser key "model.optimizer.lr": Not of type PositiveFloat: -1 does not conform to restriction v>0']
    assert "Traceback" not in err


def test_the_watchdog_gives_slow_work_its_hour_and_every_other_wait_ddp_timeout():
    """The watchdog's clock through a run's hooks, as Lightning calls them: a stage's start (the model's setup,
    pretrained weights, a checkpoint's restore), the first batch of each kind and shape (a new training image
    size: a resize stage's recompile; evaluation; a last, smaller batch) and a torch.compile compile wherever it
    happens get Watchdog.SLOW; the rest, and the waits between batches, --ddp_timeout."""
    from types import SimpleNamespace

    import torch

    from vit.training.guards import Watchdog

    dog = Watchdog(8)
    trainer = SimpleNamespace(global_rank=0, world_size=1, accumulate_grad_batches=1)
    module = SimpleNamespace(train_image_size=16)
    limit = lambda: dog.clock[1]  # noqa: E731
    batch = lambda n=4, side=32: (torch.zeros(n, 3, side, side), torch.zeros(n, dtype=torch.long))  # noqa: E731
    dog.setup(trainer, module, "fit")
    try:
        assert limit() == Watchdog.SLOW == 3600 and dog.clock[2].startswith("its start")
        dog.on_fit_start(trainer, module)
        assert limit() == 8
        for size, first in ((16, True), (16, False), (24, True), (24, False)):
            module.train_image_size = size
            dog.on_train_batch_start(trainer, module, batch(), 0)
            assert limit() == (Watchdog.SLOW if first else 8), (size, first)
            if first:
                assert dog.clock[2] == f"its first training batch of this shape at {size} px (where torch.compile " \
                                       f"compiles)"
            dog.on_train_batch_end(trainer, module, None, batch(), 0)
            assert limit() == 8
        for n, first in ((4, True), (4, False), (1, True)):
            dog.on_validation_batch_start(trainer, module, batch(n), 0)
            assert limit() == (Watchdog.SLOW if first else 8)
            dog.on_validation_batch_end(trainer, module, None, batch(n), 0)
        seen = []  # a compile anywhere (here: a callback's), as torch's compile callbacks report it

        def backend(graph, inputs):
            seen.append(limit())
            return graph.forward

        assert torch.compile(lambda x: x * 2, backend=backend)(torch.ones(3)).sum() == 6
        assert seen == [Watchdog.SLOW] and limit() == 8  # slow while it compiled, not after
        trainer.accumulate_grad_batches = 2  # a new size's first optimizer step (2 batches) is slow, the next not
        module.train_image_size = 32
        for first, after in ((True, Watchdog.SLOW), (True, 8), (False, 8), (False, 8)):
            dog.on_train_batch_start(trainer, module, batch(), 0)
            assert limit() == (Watchdog.SLOW if first else 8)
            dog.on_train_batch_end(trainer, module, None, batch(), 0)
            assert limit() == after
        assert Watchdog(7200).clock[1] == 7200  # a longer --ddp_timeout is longer than SLOW
        long = Watchdog(7200)
        long.alive(slow="a compile")
        assert long.clock[1] == 7200
    finally:
        dog.teardown(trainer, module)


@pytest.mark.long
def test_a_cold_compile_is_not_a_hang_whatever_ddp_timeout_is(tmp_path, fake_cifar_session):
    """vit_cifar10_fast as a user runs it (bf16, torch.compile, 16/24/32-px stages: a graph per size, and one
    for evaluation), from a compile cache of its own (cold), with --ddp_timeout 8: each first batch compiles
    for far longer than 8 s on a CPU, and the run ends as usual (exit 0)."""
    import json
    import os
    import subprocess
    import sys

    from helpers import ROOT

    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "WANDB_MODE")}
    env.update(WANDB_SILENT="true", PYTHONUNBUFFERED="1", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "--config", "vit_cifar10_fast",
                           "--model.arch.dim", "16", "--model.arch.depth", "2", "--model.arch.heads", "2",
                           "--trainer.accelerator", "cpu", "--data.root", str(fake_cifar_session), "--data.val_size",
                           "100", "--data.num_workers", "0", "--data.batch_size", "50", "--trainer.max_epochs", "1",
                           "--ddp_timeout", "8"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step 4: training on 32-px images" in proc.stderr + proc.stdout
    record = json.loads((tmp_path / "runs" / "vit_cifar10_fast" / "version_0" / "results.json").read_text())
    print(f"first batches (the compiles): {record['first_batches_seconds']} s")
    assert record["first_batches_seconds"] > 8  # the compiles did outlast --ddp_timeout


def test_slow_work_that_outlasts_its_time_is_stuck_too():
    """Slow work is bounded: past Watchdog.SLOW (2 s here), a process still in its start says so, with where each
    of its threads is, and exits 5 (the watchdog's own thread, while the main thread sleeps)."""
    import subprocess
    import sys

    script = """
import time
from types import SimpleNamespace
from vit.training.guards import Watchdog
Watchdog.SLOW = 2.0
dog = Watchdog(1)
dog.setup(SimpleNamespace(global_rank=0, world_size=1), None, "fit")
time.sleep(30)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 5, proc.stderr[-2000:]
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith("error: process 0: its start (the model's setup and weights, a checkpoint's restore) took "
                           "over 2 s: it is stuck"), line
    assert "allow slower steps with a --ddp_timeout over 2." in line
    assert 'File "<string>", line 8 in <module>' in proc.stderr  # the main thread's sleep


def test_the_one_wrapper_gives_a_failure_its_line_and_status_and_lets_a_bug_through(capsys):
    """vit.failures.exit_on_failure, which every command's main runs in: the project's error types print their
    one line (``stopped:`` for exit 4) and are the exit status; a built-in error, whatever its words, is raised
    again, with its traceback."""
    from vit.failures import exit_on_failure

    @exit_on_failure
    def command(error: BaseException) -> int:
        raise error

    assert command(exits.CheckpointError("x.ckpt: no such checkpoint file")) == 2
    assert capsys.readouterr().err == "error: x.ckpt: no such checkpoint file\n"
    assert command(exits.Stopped("--minutes 1 ran out in section data")) == 4
    assert capsys.readouterr().err == "stopped: --minutes 1 ran out in section data\n"
    assert command(exits.TrainingDiverged("training diverged at step 8")) == 3
    for bug in (ValueError("bad value"), KeyError("label"), RuntimeError("timed out"), FileNotFoundError("x.ckpt")):
        with pytest.raises(type(bug)) as raised:
            command(bug)
        assert raised.value is bug and raised.traceback[-1].name == "command"
    assert capsys.readouterr().err == "error: training diverged at step 8\n"


def test_what_other_code_raises_while_training_is_read_as_the_status_it_means(tmp_path):
    """vit.failures.line_and_status with a training: jsonargparse's refusal, a full quota and gloo's own error
    are exits 2, 6 and 5 with their line; the same words from anyone else, or another OSError, are a bug."""
    import errno

    from jsonargparse import ArgumentError

    from vit.failures import Training, line_and_status

    training = Training(["--config", "smoke"])
    assert line_and_status(ArgumentError(None, 'Parser key "model.lr":\n  - Given value -1\n  bad')) is None
    assert line_and_status(ArgumentError(None, 'Parser key "model.lr":\n  - Given value -1\n  bad'), training) == \
        ('Parser key "model.lr": bad', 2)
    full = OSError(errno.EDQUOT, "Disk quota exceeded", str(tmp_path / "last.ckpt"))
    line, status = line_and_status(full, training)
    assert status == 6 and line == f"the disk quota is exceeded writing {tmp_path / 'last.ckpt'} (EDQUOT: a full " \
                                   "disk or an exceeded quota, not a bug)."
    assert line_and_status(OSError(errno.ENOENT, "No such file or directory"), training) is None
    line, status = line_and_status(RuntimeError("[/src/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
                                                "[127.0.0.1]:5000"), training)
    assert status == 5 and line.startswith("process 0: lost the other processes of this run ([/src/gloo/transport/"
                                           "tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:5000). One of them")
    assert line_and_status(RuntimeError("Connection closed by peer"), training) is None
