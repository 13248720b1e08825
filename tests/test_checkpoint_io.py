"""Checkpoints on a cluster's file systems: each written atomically inside its own folder (never through the
system's temp folder), and `--ckpt_path last` resuming from the newest checkpoint that reads."""

import os
import tempfile

import pytest
import torch

from vit.cluster.checkpoint_io import save_atomically
from helpers import EVERY_STEP, assert_same_training_state, load, train_here


def test_a_save_never_uses_the_temp_folder_and_a_failed_one_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "run" / "checkpoints" / "last.ckpt"
    save_atomically({"step": 1, "w": torch.ones(1000)}, path)

    def no_temp_folder(*args, **kwargs):
        raise AssertionError("the system's temp folder was used")

    monkeypatch.setattr(tempfile, "mkstemp", no_temp_folder)
    monkeypatch.setattr(tempfile, "NamedTemporaryFile", no_temp_folder)
    save_atomically({"step": 2, "w": torch.ones(1000)}, path)
    assert load(path)["step"] == 2

    real_fsync = os.fsync

    def killed_mid_write(fd):  # the bytes are in the draft, then the process is stopped before the rename
        if os.fstat(fd).st_size > 0:
            raise KeyboardInterrupt
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", killed_mid_write)
    with pytest.raises(KeyboardInterrupt):
        save_atomically({"step": 3}, path)
    assert load(path)["step"] == 2  # the old checkpoint, whole
    assert os.listdir(path.parent) == ["last.ckpt"]  # and no partial file beside it


def test_training_writes_its_checkpoints_without_the_temp_folder(tmp_path, fake_cifar_session, monkeypatch):
    """Lightning's own writer goes through the temp folder (fsspec's transaction); the run's does not."""
    def no_temp_folder(*args, **kwargs):
        raise AssertionError("the system's temp folder was used")

    monkeypatch.setattr(tempfile, "mkstemp", no_temp_folder)
    assert train_here(tmp_path, fake_cifar_session, "--trainer.max_epochs", "1", *EVERY_STEP,
                      "--trainer.logger", "false", "--test_after_fit", "false") == 0
    names = sorted(p.name for p in (tmp_path / "runs/smoke/version_0/checkpoints").iterdir())
    assert names[1:] == ["last.ckpt", "step.ckpt"] and names[0].startswith("best-")  # no .tmp left


def test_a_torn_newest_checkpoint_is_skipped_by_name_and_the_resume_is_exact(tmp_path, fake_cifar_session, caplog):
    """A kill while a checkpoint was being copied into place (a run folder written by another tool, or an
    older writer): the newest file is a part of one. `--ckpt_path last` names it, says why it skips it, and
    resumes from the newest one that reads, to the uninterrupted run's weights."""
    quiet = ["--trainer.logger", "false", "--test_after_fit", "false",
             "--model.arch.dim", "32", "--model.arch.depth", "1", "--model.arch.heads", "2"]  # the smoke recipe, smaller
    full, part = tmp_path / "full", tmp_path / "part"
    full.mkdir(), part.mkdir()
    assert train_here(full, fake_cifar_session, "--trainer.max_epochs", "2", *quiet) == 0
    assert train_here(part, fake_cifar_session, "--trainer.max_epochs", "2", *quiet,
                      "--trainer.callbacks+=callbacks.StopAfterEpoch") == 0
    checkpoints = part / "runs/smoke/version_0/checkpoints"
    torn = checkpoints / "step.ckpt"
    torn.write_bytes((checkpoints / "last.ckpt").read_bytes()[:100_000])
    newest = max(p.stat().st_mtime_ns for p in checkpoints.iterdir()) + 10**9
    os.utime(torn, ns=(newest, newest))
    caplog.clear()
    assert train_here(part, fake_cifar_session, "--trainer.max_epochs", "2", "--ckpt_path", "last", *quiet) == 0
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("resuming "))
    assert line.startswith("resuming runs/smoke/version_0 (the newest run under runs/smoke) from its last.ckpt; "
                           f"skipped {torn.relative_to(part)}: not a readable checkpoint"), line
    assert_same_training_state(load(full / "runs/smoke/version_0/checkpoints/last.ckpt"),
                               load(checkpoints / "last.ckpt"))


def test_a_run_whose_checkpoints_all_fail_to_read_stops_with_one_line(tmp_path, fake_cifar_session, capsys):
    checkpoints = tmp_path / "runs/smoke/version_0/checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "last.ckpt").write_bytes(b"PK\x03\x04 torn")
    assert train_here(tmp_path, fake_cifar_session, "--ckpt_path", "last", "--trainer.logger", "false") == 2
    (error,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "runs/smoke/version_0: no checkpoint of this run reads (runs/smoke/version_0/checkpoints/last.ckpt: " \
           "not a readable checkpoint" in error and "move them away to start the run anew" in error
