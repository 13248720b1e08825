"""The global batch on 2 real processes (Lightning's DDP, gloo, CPU): an odd share under Mixup/CutMix is refused
before any process starts; the out-of-memory line's flags for 2 processes and accumulation train; an image-folder
batch one process cannot read is skipped by both, which stay in step; a one-process run resumes on 2 processes
sharing its global batch."""

import json
import os
import re
import sys

import pytest

from launch import ROOT, max_abs_diff, run_together, user_env
from helpers import SLURM_TASK, load, write_bad_files, write_images

TRAIN = [sys.executable, str(ROOT / "scripts" / "train.py")]
TWO = ["--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.accelerator", "cpu", "--trainer.logger",
       "false", "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
TINY_MIXING = ["--config", "vit_cifar10", "--model.arch.dim", "16", "--model.arch.depth", "1", "--model.arch.heads",
               "2", "--model.compile", "false", "--trainer.precision", "32-true", "--data.num_workers", "0", "--data.val_size", "100"]


def test_the_default_recipe_on_2_processes_refuses_15_per_process_and_trains_the_out_of_memory_advice(
        tmp_path, fake_cifar_session):
    data = ["--data.root", str(fake_cifar_session), "--trainer.max_epochs", "1", "--test_after_fit", "false"]
    (code,), out = run_together([[*TRAIN, *TINY_MIXING, *data, *TWO, "--data.batch_size", "30"]], tmp_path,
                                user_env(), timeout=120)
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert code == 2 and errors == ["error: --data.batch_size 30 is 15 images per process, an odd number, and "
                                    "Mixup/CutMix (--model.augmentation.mixup, --model.augmentation.cutmix) mixes each process's images in "
                                    "pairs: use 28 or 32 (a multiple of 4), or turn Mixup and CutMix off"], out[-3000:]
    assert "Traceback" not in out and "Initializing distributed" not in out  # no process group was made
    # the out-of-memory line's flags for 64 × 2 on 2 processes (tests/test_batches.py): 32 × 4, 16 per process
    (code,), out = run_together([[*TRAIN, *TINY_MIXING, *data, *TWO, "--data.batch_size", "32",
                                  "--trainer.accumulate_grad_batches", "4"]], tmp_path, user_env(), timeout=300)
    assert code == 0, out[-3000:]
    assert "global batch 128 = 2 processes × 16" in out
    (last,) = tmp_path.glob("runs/vit_cifar10/version_*/checkpoints/last.ckpt")
    assert load(last)["global_step"] == 400 // 128


def test_a_batch_one_process_cannot_read_is_skipped_by_both(tmp_path):
    """Image folders on 2 processes, 72 training images, a global batch of 16 (8 each): 4 optimizer steps an
    epoch. Rank 1's share of loader batch 1 is damaged after the setup check: both processes skip that step,
    rank 1 names its files, and the run trains the other 3 steps and ends."""
    root = tmp_path / "photos"
    for i, colour in enumerate([(200, 20, 20), (20, 200, 20), (20, 20, 200), (200, 200, 20)]):
        write_images(root / "train" / f"c{i}", 20, colour, size=24, seed=i)
    (code,), out = run_together([[*TRAIN, "--config", "smoke", "--data", "vit.data.ImageFolderDataModule",
                                  "--data.root", str(root), "--data.batch_size", "16", "--data.val_size", "8",
                                  "--data.num_workers", "0", "--trainer.max_epochs", "1", *TWO,
                                  "--trainer.callbacks+=callbacks.BreakBatch", "--trainer.callbacks.batch", "1",
                                  "--trainer.callbacks.rank", "1", "--trainer.callbacks+=callbacks.CountSteps"]],
                                tmp_path, user_env(), timeout=300)
    assert code == 0, out[-3000:]
    (named,) = re.findall(r"warning: process 1: skipped a training batch on every process: none of its images could "
                          r"be read \((.*)\)", out)
    assert len(named.split(", ")) == 8, named
    assert "warning: skipped a training batch on every process: another process could read none of its images" in out
    run = tmp_path / "runs/smoke/version_0"
    assert (run / "steps.0").read_text().split() == (run / "steps.1").read_text().split() == ["1", "2", "3"]
    assert "Traceback" not in out


# 1 process at 64 → 2 processes at 32 each (the same global batch): a tiny ViT, 2 epochs of 6 optimizer steps
SPLIT = [*TRAIN, "--config", "smoke", "--model.arch.dim", "16", "--model.arch.depth", "1", "--model.arch.heads", "2",
         "--data.val_size", "100", "--data.num_workers", "0", "--data.batch_size", "64", "--trainer.max_epochs", "2",
         "--trainer.accelerator", "cpu", "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
         "--trainer.enable_model_summary", "false", "--test_after_fit", "false", "--trainer.log_every_n_steps", "1",
         "--step_checkpoint_minutes", "0.0001"]
STOPS = {"epoch-end": (["--trainer.callbacks+=callbacks.StopAfterEpoch", "--trainer.callbacks.epoch", "0"], 0, 6),
         "sigkill": (["--trainer.callbacks+=callbacks.SignalAtBatch", "--trainer.callbacks.batch", "9"], -9, 8),
         "sigusr1": (["--trainer.callbacks+=callbacks.SignalAtBatch", "--trainer.callbacks.batch", "9",
                      "--trainer.callbacks.signal", "SIGUSR1"], 4, 9)}


def this_tree(**extra: str) -> dict:
    """A user's environment running this tree's vit (whatever the environment has installed)."""
    env = user_env(**extra)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(ROOT)])
    return env


@pytest.fixture(scope="module")
def whole(tmp_path_factory, fake_cifar_session) -> dict:
    """The uninterrupted run on one process: its last checkpoint."""
    cwd = tmp_path_factory.mktemp("whole")
    (code,), out = run_together([[*SPLIT, "--data.root", str(fake_cifar_session)]], cwd, this_tree(), timeout=300)
    assert code == 0, out[-3000:]
    return load(cwd / "runs/smoke/version_0/checkpoints/last.ckpt")


@pytest.mark.parametrize("stop", list(STOPS))
def test_one_process_at_64_resumes_on_2_processes_at_32_each(stop, tmp_path, fake_cifar_session, whole):
    """Stopped at epoch 0's end, killed (kill -9) or preempted (SIGUSR1, as a one-task SLURM job) inside step 9
    on one process, the run resumes on Lightning's DDP × 2 (gloo) and ends with the weights of the uninterrupted
    one-process run."""
    data = ["--data.root", str(fake_cifar_session)]
    args, status, step = STOPS[stop]
    name = "slurm-77" if stop == "sigusr1" else "part"
    env = this_tree(**SLURM_TASK) if stop == "sigusr1" else this_tree()
    (code,), out = run_together([[*SPLIT, *data, *args, *([] if stop == "sigusr1" else ["--run", name])]], tmp_path,
                                env, timeout=300)
    assert code == status, out[-3000:]
    run = tmp_path / "runs/smoke" / name / "checkpoints"
    saved = load(run / ("last.ckpt" if stop == "epoch-end" else "step.ckpt"))
    assert saved["global_step"] == step
    (code,), out = run_together([[*SPLIT, *data, "--run", name, "--ckpt_path", "last", "--trainer.devices", "2",
                                  "--trainer.strategy", "ddp"]], tmp_path, this_tree(), timeout=300)
    assert code == 0, out[-6000:]
    assert "global batch 64 = 2 processes × 32" in out
    assert load(run / "last.ckpt")["CIFAR10DataModule"]["images"] == 6 * 64  # (this tree's vit wrote it)
    resumed = load(run / "last.ckpt")
    delta = max_abs_diff(whole["state_dict"], resumed["state_dict"])
    print(f"{stop}, 1 process at 64 -> 2 processes at 32: {resumed['global_step']} steps, max |dw| {delta:.2e}")
    assert resumed["global_step"] == whole["global_step"] == 12 and delta <= 1e-4


def test_process_0_checks_the_folder_once_and_both_processes_take_its_index(tmp_path):
    """A first start on 2 processes: process 0 alone checks the images (one line), writes the folder's index,
    and both take the same training images and unreadable files. A second start reads the index (no check)
    and takes the same; with --data.on_bad_file error both processes stop with the one message."""
    root = tmp_path / "photos"
    for i, colour in enumerate([(200, 20, 20), (20, 200, 20)]):
        write_images(root / "train" / f"c{i}", 20, colour, size=24, seed=i)
    write_bad_files(root / "train" / "c1")
    index = tmp_path / "folder_index.json"
    command = [*TRAIN, "--config", "smoke", "--data", "vit.data.ImageFolderDataModule", "--data.root", str(root),
               "--data.index", str(index), "--data.batch_size", "16", "--data.val_size", "8",
               "--data.num_workers", "0", "--trainer.max_steps", "1", "--test_after_fit", "false", *TWO,
               "--trainer.callbacks+=callbacks.RecordData"]
    taken = []
    for start in range(2):
        (code,), out = run_together([command], tmp_path, user_env(), timeout=300)
        assert code == 0, out[-3000:]
        assert out.count("checking 43 images") == (1 - start), out[-3000:]
        run = tmp_path / f"runs/smoke/version_{start}"
        assert (run / "data.0").read_text() == (run / "data.1").read_text()
        taken.append(json.loads((run / "data.0").read_text()))
        assert len(taken[-1][0]) == 40 - 8 and len(taken[-1][1]) == 3
    assert taken[0] == taken[1] and json.loads(index.read_text())["images"] == 43
    (code,), out = run_together([[*command, "--data.on_bad_file", "error"]], tmp_path, user_env(), timeout=300)
    assert code == 2, out[-3000:]
    assert "3 of 43 images" in out and "Traceback" not in out
