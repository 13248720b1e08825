"""What a cluster does to a run that is not a bug (vit.environment): a full disk, the accelerator's memory,
GPUs torch cannot use, NCCL's timeouts, a W&B server out of reach. Each gives one line and its exit status,
and leaves the run resumable."""

import os
import re
import shlex
import socket
import subprocess
import sys
import time

import pytest
import torch

from helpers import ROOT, TESTS, assert_same_training_state, errors_of, load, train_here


QUIET = ["--trainer.logger", "false", "--test_after_fit", "false"]


@pytest.fixture
def small_disk(tmp_path):
    """A 64 MB file system of its own (tmpfs; root only), as a scratch file system or a quota."""
    mount = tmp_path / "scratch"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small file system needs root (CI runs as root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_one_line_and_the_resume_after_freeing_space_is_exact(tmp_path, small_disk,
                                                                          fake_cifar_session, capsys, monkeypatch):
    """The disk fills at the start of epoch 1 of 2: the epoch's checkpoint cannot be written. One line names
    the file, the cause, the last good checkpoint and the command; nothing is torn; once the space is freed,
    that command ends with the uninterrupted run's weights."""
    full = tmp_path / "full"
    full.mkdir()
    assert train_here(full, fake_cifar_session, "--trainer.max_epochs", "2", *QUIET) == 0
    args = ["--trainer.max_epochs", "2", *QUIET]
    code = train_here(small_disk, fake_cifar_session, *args, "--trainer.callbacks+=callbacks.FillDisk")
    (error,) = errors_of(capsys)
    assert code == 6, error
    run = small_disk / "runs/smoke/version_0"
    assert re.fullmatch(
        r"error: no space left on the device writing \S+/runs/smoke/version_0/checkpoints/best-\S+\.ckpt \(ENOSPC: a "
        r"full disk or an exceeded quota, not a bug\)\. The run folder runs/smoke/version_0 is intact \(checkpoints "
        r"are written whole or not at all\); its last good checkpoint is runs/smoke/version_0/checkpoints/\S+\.ckpt "
        r"\(step 8\)\. Free space, then resume with the same command: python scripts/train.py .* --ckpt_path last "
        r"--run version_0", error), error
    assert not [p.name for p in (run / "checkpoints").iterdir() if not p.name.endswith(".ckpt")]  # no part left
    (run.parent / "filler").unlink()
    command = shlex.split(error.split("resume with the same command: ")[1])
    assert command[:2] == ["python", "scripts/train.py"]
    command.remove("--trainer.callbacks+=callbacks.FillDisk")  # (the test's own disk filler, not the user's)
    from vit.commands.train import main

    monkeypatch.chdir(small_disk)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert main(command[2:]) == 0
    assert_same_training_state(load(full / "runs/smoke/version_0/checkpoints/last.ckpt"),
                               load(run / "checkpoints/last.ckpt"))


def test_the_resume_command_continues_the_same_run_folder(monkeypatch, tmp_path):
    from vit.environment import resume_command

    argv = ["--config", "smoke", "--run", "x", "--ckpt_path=last", "--data.root", "data dir"]
    for key in ("SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_JOB_NAME"):
        monkeypatch.delenv(key, raising=False)
    assert resume_command(argv, tmp_path / "version_3") == \
        "python scripts/train.py --config smoke --data.root 'data dir' --ckpt_path last --run version_3"
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_JOB_ID", "77")  # a new job has a new folder: the line names this one's
    assert resume_command(argv, tmp_path / "slurm-77") == \
        "sbatch scripts/slurm/train.sbatch --config smoke --data.root 'data dir' --run slurm-77"


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
    code = train_here(tmp_path, fake_cifar_session, *QUIET, "--trainer.callbacks+=callbacks.RaiseAtStep",
                      "--trainer.callbacks.error", error)
    err = capsys.readouterr().err
    assert code == status and message in err and "Traceback" not in err, err[-3000:]


def test_nccl_errors_reach_the_main_thread_unless_the_user_chose(monkeypatch):
    from vit.environment import nccl_errors_reach_python

    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    nccl_errors_reach_python()
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    nccl_errors_reach_python()
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch can use this machine's GPUs")
@pytest.mark.parametrize("variable, value", [("CUDA_VISIBLE_DEVICES", "0,1"), ("SLURM_JOB_GPUS", "3")])
def test_gpus_torch_cannot_use_stop_the_run_instead_of_training_on_the_cpu(tmp_path, fake_cifar_session, capsys,
                                                                          monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    for args in (["--trainer.accelerator", "auto"], None):  # a GPU recipe; and no recipe (the CPU fallback)
        if args is None:
            from vit.commands.train import main

            monkeypatch.chdir(tmp_path)
            code = main(["--data.root", str(fake_cifar_session)])
        else:
            code = train_here(tmp_path, fake_cifar_session, *args, *QUIET)
        (error,) = errors_of(capsys)
        built = f"is built for CUDA {torch.version.cuda}" if torch.version.cuda else "is a CPU-only build"
        assert code == 2 and error.startswith(f"error: this job was given GPUs ({variable}={value}) but torch cannot "
                                              f"use them: torch {torch.__version__} {built}, and "), error
        assert "--trainer.accelerator cpu" in error
    monkeypatch.delenv(variable)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.ckpt"))


@pytest.mark.long
def test_wandb_credentials_without_a_route_out_train_offline_after_a_short_wait(tmp_path, fake_cifar_session):
    """WANDB_API_KEY set, and a W&B server that accepts the connection and never answers (a firewall that
    drops, a proxy that hangs): after the probe's 10 s the run trains and tests as usual, logging offline
    into its folder, with one line that says why and how to upload. As a user runs it: bar, W&B on."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        env = {**os.environ, "PYTHONPATH": str(TESTS), "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1",
               "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
               "WANDB_BASE_URL": f"http://127.0.0.1:{silent.getsockname()[1]}"}
        env.pop("WANDB_MODE", None)
        start = time.monotonic()
        proc = subprocess.run([sys.executable, str(ROOT / "scripts/train.py"), "--config", "smoke", "--data.root",
                               str(fake_cifar_session), "--data.val_size", "100", "--data.num_workers", "0",
                               "--data.batch_size", "50", "--trainer.max_epochs", "1"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
        seconds = time.monotonic() - start
    out = proc.stdout + proc.stderr
    print(f"run with an unreachable W&B: {seconds:.1f} s")
    assert proc.returncode == 0, out[-3000:]
    run = tmp_path / "runs/smoke/version_0"
    line = (f"wandb: {env['WANDB_BASE_URL']} did not answer within 10 s; logging offline into {run.relative_to(tmp_path)}"
            f"/wandb; upload later with `wandb sync {run.relative_to(tmp_path)}/wandb/offline-run-*`")
    assert out.count(line) == 1, out[-3000:]
    assert len(list((run / "wandb").glob("offline-run-*"))) == 1 and (run / "results.json").is_file()
    assert "Traceback" not in out and seconds < 180
