"""A resumed run may split its global batch (--data.batch_size × --trainer.accumulate_grad_batches, shared among
the processes) otherwise than the run it continues, as the out-of-memory advice says: stopped at an epoch's end,
killed or preempted mid-epoch, it ends with the uninterrupted run's optimizer steps and weights (vit.data.resume keeps
the data's position in images). A changed global batch is refused before training. 1 process → 2 processes:
tests/cluster/test_batches_ddp.py."""

import signal

import pytest
import torch

from helpers import EVERY_STEP, QUIET, SLURM_TASK, errors_of, load, train, train_here

# a tiny ViT, 2 epochs of 6 optimizer steps of 64 images (384 of the 400 training images)
TINY = ["--model.arch.dim", "16", "--model.arch.depth", "1", "--model.arch.heads", "2", "--trainer.max_epochs", "2",
        "--trainer.logger", "false", "--test_after_fit", "false", "--trainer.log_every_n_steps", "1", *QUIET,
        *EVERY_STEP]
SPLITS = {"64x1": ["--data.batch_size", "64", "--trainer.accumulate_grad_batches", "1"],
          "32x2": ["--data.batch_size", "32", "--trainer.accumulate_grad_batches", "2"]}
STEPS = 2 * (400 // 64)


def split(name: str) -> list[str]:
    return [*TINY, *SPLITS[name]]


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, fake_cifar_session) -> dict:
    """The run at 64 × 1, never stopped: its last checkpoint."""
    cwd = tmp_path_factory.mktemp("uninterrupted")
    assert train_here(cwd, fake_cifar_session, *split("64x1")) == 0
    return load(cwd / "runs/smoke/version_0/checkpoints/last.ckpt")


def batch_in_epoch_1(name: str) -> int:
    """The run's training batch (from 1) inside optimizer step 9 (the third of epoch 1), in its first half."""
    k = int(name.split("x")[1])
    return 8 * k + 1


def check_same_as_uninterrupted(uninterrupted: dict, last: dict, case: str) -> None:
    delta = max_abs_diff(uninterrupted["state_dict"], last["state_dict"])
    print(f"{case}: {last['global_step']} steps (uninterrupted: {uninterrupted['global_step']}), max |dw| {delta:.2e}")
    assert last["global_step"] == uninterrupted["global_step"] == STEPS and last["epoch"] == uninterrupted["epoch"]
    assert delta <= 1e-4


@pytest.mark.parametrize("before,after", [("64x1", "32x2"), ("32x2", "64x1")])
def test_stopped_at_an_epochs_end_it_resumes_in_another_split(before, after, tmp_path, fake_cifar_session,
                                                              uninterrupted):
    assert train_here(tmp_path, fake_cifar_session, *split(before), "--trainer.callbacks+=callbacks.StopAfterEpoch",
                      "--trainer.callbacks.epoch", "0") == 0
    run = tmp_path / "runs/smoke/version_0/checkpoints"
    assert load(run / "last.ckpt")["global_step"] == STEPS // 2
    assert train_here(tmp_path, fake_cifar_session, *split(after), "--ckpt_path", "last") == 0
    check_same_as_uninterrupted(uninterrupted, load(run / "last.ckpt"), f"epoch end, {before} -> {after}")


@pytest.mark.parametrize("before,after", [("64x1", "32x2"), ("32x2", "64x1")])
def test_preempted_mid_epoch_it_resumes_in_another_split(before, after, tmp_path, fake_cifar_session, uninterrupted,
                                                         monkeypatch, capsys):
    """SIGUSR1 in the first half of step 9 (epoch 1) of a one-task SLURM job: it stops at step 9's end (exit 4),
    and the requeued job resumes in the other split."""
    for key, value in SLURM_TASK.items():
        monkeypatch.setenv(key, value)
    handler = signal.getsignal(signal.SIGUSR1)
    try:
        assert train_here(tmp_path, fake_cifar_session, *split(before),
                          "--trainer.callbacks+=callbacks.SignalAtBatch", "--trainer.callbacks.batch",
                          str(batch_in_epoch_1(before)), "--trainer.callbacks.signal", "SIGUSR1") == 4
        step = load(tmp_path / "runs/smoke/slurm-77/checkpoints/step.ckpt")
        assert step["global_step"] == 9 and step["CIFAR10DataModule"]["images"] == 3 * 64
        assert train_here(tmp_path, fake_cifar_session, *split(after), "--ckpt_path", "last") == 0, errors_of(capsys)
    finally:
        signal.signal(signal.SIGUSR1, handler)
    check_same_as_uninterrupted(uninterrupted, load(tmp_path / "runs/smoke/slurm-77/checkpoints/last.ckpt"),
                                f"SIGUSR1 mid-epoch, {before} -> {after}")


def test_preempted_where_the_processes_agree_only_at_epochs_ends_it_stops_after_the_epoch(
        tmp_path, fake_cifar_session, uninterrupted, monkeypatch, capsys):
    """SIGUSR1 at step 3 of a run whose processes agree every 6 steps (--trainer.log_every_n_steps 6: an epoch's
    6 steps): the agreement comes at the epoch's last step; the epoch ends with its checkpoints, the job stops
    (exit 4) as epoch 1 starts, and the requeued job ends as the uninterrupted run."""
    for key, value in SLURM_TASK.items():
        monkeypatch.setenv(key, value)
    handler = signal.getsignal(signal.SIGUSR1)
    every = ["--trainer.log_every_n_steps", str(STEPS // 2)]
    try:
        assert train_here(tmp_path, fake_cifar_session, *split("64x1"), *every,
                          "--trainer.callbacks+=callbacks.SignalAtBatch", "--trainer.callbacks.batch", "3",
                          "--trainer.callbacks.signal", "SIGUSR1") == 4
        assert "stopped at the end of epoch 0 (step 6), after its checkpoints" in capsys.readouterr().err
        assert load(tmp_path / "runs/smoke/slurm-77/checkpoints/last.ckpt")["global_step"] == STEPS // 2
        assert train_here(tmp_path, fake_cifar_session, *split("64x1"), *every, "--ckpt_path", "last") == 0
    finally:
        signal.signal(signal.SIGUSR1, handler)
    check_same_as_uninterrupted(uninterrupted, load(tmp_path / "runs/smoke/slurm-77/checkpoints/last.ckpt"),
                                "SIGUSR1 agreed at an epoch's end")


@pytest.mark.long
@pytest.mark.parametrize("before,after", [("64x1", "32x2"), ("32x2", "64x1")])
def test_killed_mid_epoch_it_resumes_in_another_split(before, after, tmp_path, fake_cifar_session, uninterrupted):
    """kill -9 in the first half of step 9 (epoch 1): the step checkpoint of step 8 is the newest, and the resumed
    run in the other split ends as the uninterrupted one."""
    killed = train(tmp_path, fake_cifar_session, *split(before), "--trainer.callbacks+=callbacks.SignalAtBatch",
                   "--trainer.callbacks.batch", str(batch_in_epoch_1(before)))
    assert killed.returncode == -9, killed.stderr[-3000:]
    step = load(tmp_path / "runs/smoke/version_0/checkpoints/step.ckpt")
    assert step["global_step"] == 8 and step["CIFAR10DataModule"]["images"] == 2 * 64
    assert train_here(tmp_path, fake_cifar_session, *split(after), "--ckpt_path", "last") == 0
    check_same_as_uninterrupted(uninterrupted, load(tmp_path / "runs/smoke/version_0/checkpoints/last.ckpt"),
                                f"SIGKILL mid-epoch, {before} -> {after}")


def test_a_changed_global_batch_is_refused_before_training(tmp_path, fake_cifar_session, capsys):
    assert train_here(tmp_path, fake_cifar_session, *split("64x1"), "--trainer.callbacks+=callbacks.StopAfterEpoch",
                      "--trainer.callbacks.epoch", "0") == 0
    last = tmp_path / "runs/smoke/version_0/checkpoints/last.ckpt"
    before = load(last)
    assert train_here(tmp_path, fake_cifar_session, *TINY, "--data.batch_size", "32", "--trainer.accumulate_grad_batches",
                      "1", "--ckpt_path", "last") == 2
    assert errors_of(capsys) == [
        f"error: {last.relative_to(tmp_path)}: written with a global batch of 64 images per optimizer step, and this "
        "run's is 32 (--data.batch_size 32 × --trainer.accumulate_grad_batches 1): resume with --data.batch_size × "
        "--trainer.accumulate_grad_batches = 64, split as you like, or start a new run"]
    torch.testing.assert_close(load(last)["state_dict"], before["state_dict"], rtol=0, atol=0)  # nothing trained


