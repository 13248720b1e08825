"""A full disk or an exceeded quota where a run writes (vit.cluster.storage): one line, exit 6, and a run that the
command it names resumes exactly."""

import os
import re
import shlex
import subprocess

import pytest

from helpers import assert_same_training_state, errors_of, load, train_here


# the smoke recipe on a smaller model (what is checked: the files written, the line, the resumed weights)
QUIET = ["--trainer.logger", "false", "--test_after_fit", "false", "--model.arch.dim", "32", "--model.arch.depth", "1",
         "--model.arch.heads", "2"]


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


@pytest.mark.long
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
    from vit.cluster.storage import resume_command

    argv = ["--config", "smoke", "--run", "x", "--ckpt_path=last", "--data.root", "data dir"]
    for key in ("SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_JOB_NAME"):
        monkeypatch.delenv(key, raising=False)
    assert resume_command(argv, tmp_path / "version_3") == \
        "python scripts/train.py --config smoke --data.root 'data dir' --ckpt_path last --run version_3"
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_JOB_ID", "77")  # a new job has a new folder: the line names this one's
    assert resume_command(argv, tmp_path / "slurm-77") == \
        "sbatch scripts/slurm/train.sbatch --config smoke --data.root 'data dir' --run slurm-77"
