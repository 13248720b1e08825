"""A training step issues few ops outside its compiled graphs and never waits on the host: torch.profiler's
count (vit.training.step_profile) over steady steps of the fast recipe, run as a user runs it, on the CPU. On a GPU
each such op is about one kernel launch and each ``aten::_local_scalar_dense`` a host sync."""

import json
import subprocess
import sys

import pytest
import torch

from helpers import ROOT, TESTS

PROFILE = ["--trainer.callbacks+", "vit.training.step_profile.StepProfile", "--trainer.callbacks.start", "4",
           "--trainer.callbacks.steps", "6", "--trainer.callbacks.stop", "true"]


def profile(cwd, data, out, *extra: str) -> dict:
    """vit_cifar10_fast at batch 64 on the CPU, profiled from step 4 for 6 steps, then stopped (a subprocess,
    as a user runs it); the counts it wrote."""
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]), "WANDB_MODE": "disabled"}
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), "--config", "vit_cifar10_fast", "--data.root", str(data),
           "--data.val_size", "100", "--data.batch_size", "64", "--data.num_workers", "0",
           "--trainer.accelerator", "cpu", "--trainer.max_steps", "40", "--trainer.logger", "false",
           "--trainer.enable_model_summary", "false", "--test_after_fit", "false",
           *PROFILE, "--trainer.callbacks.path", str(out), *extra]
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "step profile (steps 4–9)" in done.stderr + done.stdout
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from vit.data.cifar import write_fake

    # 1,400 training images: 21 steps of 64 an epoch, so the profiled steps 4-9 are inside the first epoch
    return write_fake(tmp_path_factory.mktemp("cifar") / "data", per_batch=300, test_size=100)


def test_the_fast_recipes_step_reads_nothing_on_the_host(tmp_path, data):
    """Eager, at a small width (the count of host syncs does not depend on either): Muon with its AdamW,
    clipping, the divergence guard, the metrics, Mixup/CutMix, random erasing, the device data path with
    AutoAugment and the progress bar read nothing on the host inside the step (the bar reads the loss every
    50 steps, outside this window)."""
    counts = profile(tmp_path, data, tmp_path / "profile.json", "--model.compile", "false",
                     "--model.arch.dim", "32", "--model.arch.depth", "2", "--model.arch.heads", "2")
    assert counts["steps"] == 6 and counts["batch_size"] == 64 and counts["compiled"] is False
    assert counts["compiles"] == 0
    assert counts["host_syncs_per_step"] == 0, counts["host_syncs_by_caller_per_step"]
    assert counts["ops_outside_compiled_per_step"] > 100  # eager: the model's ops are all outside a graph


def test_the_count_sees_a_host_sync():
    """The counter itself: a ``.item()`` is a host sync, and its ops are counted once each."""
    from vit.training.step_profile import count

    def step(x):
        return (x * 2).sum().item()

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            step(torch.ones(4))
    counted = count(prof.events(), 2)
    assert counted["host_syncs_per_step"] == 1 and counted["ops_outside_compiled_per_step"] >= 3
    assert counted["compiles"] == 0
    assert counted["launching_ops_outside_compiled_per_step"] <= counted["ops_outside_compiled_per_step"]


@pytest.mark.long
def test_the_fast_recipes_compiled_step_issues_few_ops_outside_its_graphs(tmp_path, data):
    """The fast recipe as it is (default model, compiled, bf16-mixed), batch 64: Muon's step (with the gradient
    norm and clipping) runs inside its compiled graphs, with no recompile over steps whose lr changes, and so
    do the loss, the training metrics' sums and the divergence guard's watch; at most 60 ops a step outside
    the compiled graphs that launch a kernel, and no host sync. The recipe's record (results/step-profile/,
    docs/speed.md) is below the limit with a margin; the count does not depend on the CPU (it counts ops, not
    time)."""
    counts = profile(tmp_path, data, tmp_path / "profile.json")
    assert counts["compiled"] is True and counts["precision"] == "bf16-mixed" and counts["compiles"] == 0
    assert counts["host_syncs_per_step"] == 0, counts["host_syncs_by_caller_per_step"]
    launching = counts["top_launching_ops_per_step"]
    assert not [name for name in launching if "_foreach" in name or name == "aten::baddbmm"], launching
    assert counts["launching_ops_outside_compiled_per_step"] <= 60, launching


def test_clipping_takes_torchs_norm_in_few_ops():
    """The recipe's clipping with an optimizer other than Muon (ViTClassifier.configure_gradient_clipping, by norm,
    without a gradient scaler) leaves the gradients torch's clip_grad_norm_ leaves, and keeps torch's norm for
    the divergence guard (grad_norm)."""
    from types import SimpleNamespace

    from vit.training.module import ViTClassifier
    from vit.training.optim import total_norm

    torch.manual_seed(0)
    module = ViTClassifier(arch={"dim": 16, "depth": 1, "heads": 2})
    reference = [torch.randn_like(p) * 3 for p in module.parameters()]
    for p, g in zip(module.parameters(), reference):
        p.grad = g.clone()
    assert torch.allclose(total_norm([p.grad for p in module.parameters()]),
                          torch.nn.utils.get_total_norm(reference))
    plugin = SimpleNamespace(main_params=lambda optimizer: list(module.parameters()))
    module.trainer = SimpleNamespace(precision_plugin=plugin)  # (what the hook reads of the Trainer)
    module.configure_gradient_clipping(None, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in reference]
    for p, g in zip(params, reference):
        p.grad = g.clone()
    norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
    torch.testing.assert_close(module.grad_norm, norm)
    for ours, theirs in zip(module.parameters(), params):
        torch.testing.assert_close(ours.grad, theirs.grad)
    assert torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])) < 1.0001  # clipped: it could fail


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_one_gradient_norm_a_step_for_clipping_and_the_guard(tmp_path, fake_cifar, optimizer):
    """With clipping on (the recipes' gradient_clip_val 1.0) and the divergence guard (StopOnNonFinite, always
    on), a step takes the gradients' total norm once: 5 steps, 5 norms (vit.training.optim.total_norm, which
    Muon's step and the module's clipping both call)."""
    from unittest import mock

    from helpers import train_here
    from vit.training import optim

    with mock.patch.object(optim, "total_norm", wraps=optim.total_norm) as norms:
        assert train_here(tmp_path, fake_cifar, "--model.optimizer.name", optimizer, "--trainer.gradient_clip_val",
                          "1.0", "--trainer.max_steps", "5", "--trainer.limit_val_batches", "0",
                          "--test_after_fit", "false") == 0
    assert norms.call_count == 5


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_the_guard_sees_a_non_finite_gradient_through_that_norm(tmp_path, fake_cifar, capsys, optimizer):
    """A gradient made NaN before step 2 (the loss finite): the divergence guard, reading the norm that clipping
    took, stops the run at that step."""
    from helpers import errors_of, train_here

    assert train_here(tmp_path, fake_cifar, "--model.optimizer.name", optimizer, "--trainer.max_steps", "5",
                      "--trainer.logger", "false", "--trainer.callbacks+=callbacks.PoisonGradientAtStep",
                      "--trainer.callbacks.step", "2") == 3
    (line,) = errors_of(capsys)
    assert line.startswith("error: training diverged at step 2 "), line


def test_cuda_graphs_are_no_option(tmp_path, fake_cifar, capsys):
    """--model.compile is true or false: "reduce-overhead" (CUDA graphs) is refused by the parser in one line,
    before training."""
    from helpers import errors_of, train_here

    assert train_here(tmp_path, fake_cifar, "--model.compile", "reduce-overhead") == 2
    (line,) = errors_of(capsys)
    assert "model.compile" in line and "reduce-overhead" in line
    assert not list(tmp_path.glob("runs/**/*.ckpt"))  # nothing trained


def test_values_are_read_on_the_host_every_log_every_n_steps_steps_alone(tmp_path, data):
    """One process, the fast recipe eager at a small width, log_every_n_steps 3, the CSV logger, Throughput, the
    progress bar's lines and the divergence guard on: each step's host syncs (tests/callbacks.py StepEvents, steps
    3 to 11 of the first epoch's 21) happen at the steps that are multiples of 3, and at no other."""
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]), "WANDB_MODE": "disabled"}
    recipe = str(ROOT / "configs" / "vit_cifar10_fast.yaml")  # (this tree's, whichever tree is installed)
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), "--config", recipe, "--data.root", str(data),
           "--data.val_size", "100", "--data.batch_size", "64", "--data.num_workers", "0",
           "--trainer.accelerator", "cpu", "--trainer.max_steps", "12", "--trainer.logger",
           "vit.training.loggers.CSVLogger", "--trainer.log_every_n_steps", "3", "--trainer.enable_model_summary",
           "false", "--test_after_fit", "false", "--model.compile", "false", "--model.arch.dim", "32",
           "--model.arch.depth", "2", "--model.arch.heads", "2",
           "--trainer.callbacks+=callbacks.StepEvents", "--trainer.callbacks.start", "2", "--trainer.callbacks.steps", "9"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (written,) = tmp_path.rglob("steps.0.json")  # (in the run's folder)
    steps = {int(s): v["syncs"] for s, v in json.loads(written.read_text()).items()}
    assert sorted(steps) == list(range(3, 12)), steps
    assert all(steps[s] > 0 for s in (3, 6, 9)) and all(n == 0 for s, n in steps.items() if s % 3), steps
