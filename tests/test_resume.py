"""No work lost beyond one step checkpoint's interval: a run killed mid-epoch, or stopped at an epoch's end,
continues from its newest checkpoint (`--ckpt_path last`) to exactly the uninterrupted run's weights
(vit.data.resume), in its own run folder and W&B run."""

import multiprocessing
import re

import pytest

from helpers import (EVERY_STEP, QUIET, TEST_LINE, assert_same_training_state, load, train, train_here,
                     write_images)



@pytest.mark.long
def test_a_run_killed_mid_epoch_resumes_from_its_step_checkpoint_exactly(tmp_path, fake_cifar_session):
    """kill -9 at step 5 of 8 in epoch 0, as a user runs it (progress lines, W&B offline, the test at the end):
    the step checkpoint of step 4 is on disk, `--ckpt_path last` takes it over last.ckpt, and the run ends
    with the weights of the uninterrupted run (made in this process, quiet and without a logger: neither
    changes a weight), logging to the same W&B run."""
    args = ["--trainer.max_epochs", "2", *EVERY_STEP]
    full, part = tmp_path / "full", tmp_path / "part"
    full.mkdir(), part.mkdir()
    assert train_here(full, fake_cifar_session, *args, "--trainer.logger", "false", "--test_after_fit", "false") == 0
    killed = train(part, fake_cifar_session, *args, "--trainer.callbacks+=callbacks.CrashAtStep",
                   "--trainer.callbacks.step", "5", quiet=False)
    assert killed.returncode == -9, killed.stderr[-3000:]
    run = part / "runs/smoke/version_0"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step.ckpt"]  # no epoch ended
    step = load(run / "checkpoints/step.ckpt")
    assert step["global_step"] == 4  # one interval (here: one step) lost, no more
    run_id = (run / "wandb_id").read_text().strip()
    assert step["vit"]["wandb_run_id"] == run_id

    resumed = train(part, fake_cifar_session, *args, "--ckpt_path", "last", quiet=False)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming runs/smoke/version_0 (the newest run under runs/smoke) from its step.ckpt" in resumed.stderr
    assert "epoch 0 batch 5/8 step 5" in resumed.stderr  # the lost step, done again
    assert len(re.findall(TEST_LINE, resumed.stderr)) == 1 and "Traceback" not in resumed.stderr
    assert_same_training_state(load(full / "runs/smoke/version_0/checkpoints/last.ckpt"),
                               load(run / "checkpoints/last.ckpt"))
    wandb_runs = sorted((run / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == 2 and all(r.name.endswith(run_id) for r in wandb_runs)  # one W&B run
    epochs = [line.split(",")[0] for line in (run / "metrics.csv").read_text().splitlines()[1:]]
    assert {"0", "1"} <= set(epochs)  # the resumed run appended to its metrics, it did not start them anew


# Everything with a random draw on at once: crops and flips (and RandAugment) per image in a worker or on
# the device, Mixup/CutMix, random erasing, stochastic depth, token dropping, progressive resizing across
# its switches (16 px for steps 0-3, 24 px for 4-11, 32 px after), the EMA, Muon.
LEVERS = ["--model.optimizer.name", "muon", "--model.ema_decay", "0.9", "--model.arch.patch_drop", "0.25",
          "--model.arch.drop_path", "0.1", "--model.augmentation.mixup", "0.8", "--model.augmentation.cutmix", "1.0",
          "--model.augmentation.random_erasing", "0.25", "--model.schedule.resize_stages", "[[16, 0.25], [24, 0.75]]",
          "--trainer.max_epochs", "2", "--trainer.logger", "false", "--test_after_fit", "false", *QUIET, *EVERY_STEP]
SOURCES = {
    "cifar-workers": ["--data.num_workers", "1", "--data.auto_augment", "randaugment"],
    "cifar-device": ["--data.num_workers", "0", "--data.pipeline", "device"],
    "folders": ["--data", "vit.data.ImageFolderDataModule", "--data.num_workers", "1"],
}


@pytest.mark.parametrize("source", [pytest.param(s, marks=pytest.mark.long) if s == "cifar-workers" else s for s in SOURCES])
def test_resume_from_an_epoch_end_and_from_mid_epoch_is_exact_whichever_is_on(source, tmp_path, fake_cifar_session,
                                                                               monkeypatch, caplog):
    """vit-train's main() in this process (4 runs each). The interrupted run stops after epoch 0 (last.ckpt),
    resumes, crashes at step 11 (mid-epoch 1, in the 24-px stage), and resumes from the step checkpoint of
    step 10 across the switch to 32 px; its weights, EMA, optimizer state and schedule end equal."""
    from vit.commands.train import main

    if source == "folders":
        root = tmp_path / "photos"
        for i, colour in enumerate([(200, 20, 20), (20, 200, 20), (20, 20, 200), (200, 200, 20)]):
            write_images(root / "train" / f"c{i}", 25, colour, size=24, seed=i)
        data = ["--data.root", str(root), "--data.batch_size", "10", "--data.val_size", "20"]
    else:
        data = ["--data.root", str(fake_cifar_session), "--data.val_size", "100", "--data.batch_size", "50"]
    args = ["--config", "smoke", *data, *LEVERS, *SOURCES[source]]

    def run(folder, *extra):
        folder.mkdir(exist_ok=True)
        monkeypatch.chdir(folder)
        return main([*args, *extra])

    before = set(multiprocessing.active_children())
    assert run(tmp_path / "full") == 0
    part = tmp_path / "part"
    assert run(part, "--trainer.callbacks+=callbacks.StopAfterEpoch", "--trainer.callbacks.epoch", "0") == 0
    assert load(part / "runs/smoke/version_0/checkpoints/last.ckpt")["epoch"] == 0
    with pytest.raises(RuntimeError, match="crashed at step 11"):
        run(part, "--ckpt_path", "last", "--trainer.callbacks+=callbacks.CrashAtStep",
            "--trainer.callbacks.step", "11", "--trainer.callbacks.kill", "false")
    assert load(part / "runs/smoke/version_0/checkpoints/step.ckpt")["global_step"] == 10
    # the loaders' persistent workers ended with their stage, the crashed run's too (not at garbage collection)
    assert set(multiprocessing.active_children()) <= before
    assert run(part, "--ckpt_path", "last") == 0
    assert "from its last.ckpt" in caplog.text and "from its step.ckpt" in caplog.text
    a, b = (load(tmp_path / f / "runs/smoke/version_0/checkpoints/last.ckpt") for f in ("full", "part"))
    assert a["global_step"] == 16 and a["schedule"]["share"] == 1.0
    assert any(k.startswith("ema.module.") for k in a["state_dict"])
    assert_same_training_state(a, b)
    assert set(multiprocessing.active_children()) <= before


def test_a_crash_in_an_epochs_validation_resumes_to_that_validation(tmp_path, fake_cifar_session, monkeypatch):
    """No step checkpoint at an epoch's last step: Lightning would resume it as a finished epoch and skip
    the epoch's validation and its checkpoints. The crash in validation resumes from the step before and
    validates the epoch."""
    from vit.commands.train import main

    monkeypatch.chdir(tmp_path)
    args = ["--config", "smoke", "--data.root", str(fake_cifar_session), "--data.val_size", "100",
            "--data.batch_size", "50", "--data.num_workers", "0", "--trainer.max_epochs", "1",
            "--trainer.logger", "false", "--test_after_fit", "false", *QUIET, *EVERY_STEP]
    with pytest.raises(RuntimeError, match="crashed in the validation of epoch 0"):
        main([*args, "--trainer.callbacks+=callbacks.CrashInValidation"])
    checkpoints = tmp_path / "runs/smoke/version_0/checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step.ckpt"]
    assert load(checkpoints / "step.ckpt")["global_step"] == 7  # of 8: not the epoch's last
    assert main([*args, "--ckpt_path", "last"]) == 0
    assert load(checkpoints / "last.ckpt")["global_step"] == 8
    (best,) = checkpoints.glob("best-epoch000-*.ckpt")  # epoch 0 was validated
