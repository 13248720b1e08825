"""Gradient accumulation (Lightning's --trainer.accumulate_grad_batches K) is the larger batch in K passes:
B images × K trains as one batch of B·K would (the same images per optimizer step, the same lr), and a run
killed or preempted inside an accumulation window resumes to the uninterrupted run's weights (checkpoints
and stops land on optimizer steps' ends: vit.data.resume.at_step_end)."""

import re
import signal
from types import SimpleNamespace

import pytest
import torch

from helpers import EVERY_STEP, QUIET, SLURM_TASK, assert_same_training_state, load, train, train_here

OFF = ["--trainer.logger", "false", "--test_after_fit", "false", *QUIET]


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def batches(source: str, fake_cifar, batch: int, accumulate: int, epoch: int = 0) -> list[list[tuple[int, bytes]]]:
    """The train loader's batches of one epoch (images and labels, sorted per batch), as one process reads them."""
    from vit.data.datamodules import CIFAR10DataModule

    dm = CIFAR10DataModule(root=str(fake_cifar), val_size=100, num_workers=0, batch_size=batch, pipeline=source)
    dm.trainer = SimpleNamespace(world_size=1, global_rank=0, accumulate_grad_batches=accumulate, lightning_module=None,
                                 strategy=SimpleNamespace(root_device=torch.device("cpu")))
    dm.setup("fit")
    dm.position.epochs = epoch
    return [sorted((int(y), x.numpy().tobytes()) for x, y in zip(*b)) for b in dm.train_dataloader()]


@pytest.mark.parametrize("source", ["workers", "device"])
def test_k_batches_of_b_are_the_images_and_augmentations_of_one_batch_of_b_times_k(source, fake_cifar):
    """400 training images: one batch of 120 is 3 steps (40 images dropped); 40 × 3 is those 3 steps' images,
    crops and flips, in 9 batches (not 10: the last step would be a third of one)."""
    whole = batches(source, fake_cifar, 120, 1)
    parts = batches(source, fake_cifar, 40, 3)
    assert len(whole) == 3 and len(parts) == 9
    assert [sorted(sum(parts[3 * i:3 * i + 3], [])) for i in range(3)] == whole


def test_b_times_k_trains_the_weights_of_one_batch_of_b_times_k(tmp_path, fake_cifar_session):
    """The smoke recipe, 2 epochs: batch 50 against 25 × 2 (and 10 × 5: 2.6e-6 on a 2-core AMD EPYC)."""
    weights = {}
    for batch, k in ((50, 1), (25, 2)):
        cwd = tmp_path / f"{batch}x{k}"
        cwd.mkdir()
        assert train_here(cwd, fake_cifar_session, "--data.batch_size", str(batch), "--trainer.max_epochs", "2",
                          "--trainer.accumulate_grad_batches", str(k), *OFF) == 0
        ckpt = load(cwd / "runs/smoke/version_0/checkpoints/last.ckpt")
        assert ckpt["global_step"] == 16
        weights[batch] = ckpt["state_dict"]
    for batch in (25,):
        delta = max_abs_diff(weights[50], weights[batch])
        print(f"smoke, 2 epochs: batch 50 against {batch} × {50 // batch}: max |dw| {delta:.2e}")
        assert delta <= 1e-4


def test_with_mixup_b_times_k_keeps_the_lr_and_the_images_of_each_optimizer_step(tmp_path, fake_cifar_session, caplog,
                                                                                   monkeypatch):
    """The default recipe's Mixup/CutMix (mixing within each batch, so not the same weights), on a tiny model in
    fp32: the same lr, and each optimizer step trains on the images of the one batch of B·K."""
    from vit.commands.train import main

    mixing = ["--config", "vit_cifar10", "--data.root", str(fake_cifar_session), "--data.val_size", "100",
              "--data.num_workers", "0", "--model.arch.dim", "16", "--model.arch.depth", "1", "--model.arch.heads",
              "2", "--trainer.precision", "32-true", "--trainer.accelerator", "cpu", "--trainer.devices", "1",
              "--model.compile", "false", "--trainer.max_epochs", "1", "--trainer.callbacks+=callbacks.RecordBatches", *OFF]
    monkeypatch.setenv("WANDB_MODE", "disabled")
    seen, lrs = {}, {}
    for batch, k in ((40, 1), (20, 2)):
        cwd = tmp_path / f"{batch}x{k}"
        cwd.mkdir()
        monkeypatch.chdir(cwd)
        caplog.clear()
        assert main([*mixing, "--data.batch_size", str(batch), "--trainer.accumulate_grad_batches", str(k)]) == 0
        (lrs[batch],) = re.findall(r"global batch (\d+): lr [\d.e-]+ × \d+/\d+ = ([\d.e-]+)", caplog.text)
        steps: dict[str, list[str]] = {}
        for line in (next((cwd / "runs").glob("*/version_0")) / "batches.0").read_text().splitlines():
            step, *images = line.split()
            steps.setdefault(step, []).extend(images)
        seen[batch] = {step: sorted(images) for step, images in steps.items()}
    assert lrs[40] == lrs[20] == ("40", lrs[40][1])  # the images per optimizer step and the lr they are stated for
    assert seen[40] == seen[20] and len(seen[40]) == 400 // 40


ARGS = ["--data.batch_size", "25", "--trainer.accumulate_grad_batches", "2", "--trainer.max_epochs", "1"]


@pytest.mark.long
def test_a_run_killed_inside_an_accumulation_window_resumes_exactly(tmp_path, fake_cifar_session):
    """25 × 2, a step checkpoint due every 0.6 s, falling due after batch 11 (the first half of step 6: a pause
    there); kill -9 after batch 13: the step checkpoint is step 6's, after its 12 batches, not one inside a
    step, and the resumed run ends with the uninterrupted run's weights, optimizer state and schedule."""
    args = [*ARGS, "--step_checkpoint_minutes", "0.01", "--trainer.log_every_n_steps", "1"]  # (a check each step)
    full, part = tmp_path / "full", tmp_path / "part"
    full.mkdir(), part.mkdir()
    assert train_here(full, fake_cifar_session, *args, *OFF) == 0
    killed = train(part, fake_cifar_session, *args, "--trainer.callbacks+=callbacks.PauseAtBatch",
                   "--trainer.callbacks.batch", "11", "--trainer.callbacks+=callbacks.SignalAtBatch",
                   "--trainer.callbacks.batch", "13")
    assert killed.returncode == -9, killed.stderr[-3000:]
    step = load(part / "runs/smoke/version_0/checkpoints/step.ckpt")
    assert step["global_step"] == 6 and step["CIFAR10DataModule"]["images"] == 12 * 25  # step 6's end
    resumed = train(part, fake_cifar_session, *args, "--ckpt_path", "last", "--test_after_fit", "false")
    assert resumed.returncode == 0 and "from its step.ckpt" in resumed.stderr, resumed.stderr[-3000:]
    assert_same_training_state(load(full / "runs/smoke/version_0/checkpoints/last.ckpt"),
                               load(part / "runs/smoke/version_0/checkpoints/last.ckpt"))


def test_sigusr1_inside_an_accumulation_window_stops_at_the_steps_end_and_resumes_exactly(
        tmp_path, fake_cifar_session, monkeypatch, capsys):
    """A one-task SLURM job (its variables, in this process) gets SIGUSR1 after batch 11, the first half of
    step 6: it finishes step 6, saves it, exits 4, and the requeued job (the same id) resumes to the weights of
    the uninterrupted run."""
    args = [*ARGS, *EVERY_STEP, "--trainer.log_every_n_steps", "1", *OFF]
    full, part = tmp_path / "full", tmp_path / "part"
    full.mkdir(), part.mkdir()
    assert train_here(full, fake_cifar_session, *args) == 0
    for key, value in SLURM_TASK.items():
        monkeypatch.setenv(key, value)
    handler = signal.getsignal(signal.SIGUSR1)
    try:
        assert train_here(part, fake_cifar_session, *args, "--trainer.callbacks+=callbacks.SignalAtBatch",
                          "--trainer.callbacks.batch", "11", "--trainer.callbacks.signal", "SIGUSR1") == 4
        assert "got SIGUSR1 (a time limit or preemption is near): stopped at step 6, in epoch 0" in capsys.readouterr().err
        step = load(part / "runs/smoke/slurm-77/checkpoints/step.ckpt")
        assert step["global_step"] == 6 and step["CIFAR10DataModule"]["images"] == 12 * 25
        assert train_here(part, fake_cifar_session, *args, "--ckpt_path", "last") == 0
    finally:
        signal.signal(signal.SIGUSR1, handler)
    assert_same_training_state(load(full / "runs/smoke/version_0/checkpoints/last.ckpt"),
                               load(part / "runs/smoke/slurm-77/checkpoints/last.ckpt"))
