"""torch.compile gives the same model, and the GPU recipe's compiled paths run where CI can (CPU: inductor,
bf16 autocast): vit_cifar10_fast compiled through its 16-, 24- and 32-px stages with one compilation per
image size, equal to eager; and as a user runs it, in bf16-mixed with Muon and the device data path."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch
import yaml

import vit

from helpers import ROOT, TEST_LINE, load


def _can_compile() -> str | None:
    try:
        torch.compile(lambda x: x * 2)(torch.ones(2))
    except Exception as e:  # noqa: BLE001 - any backend failure means "cannot compile here"
        return f"torch.compile unavailable on this platform: {type(e).__name__}: {e}"
    return None


needs_compile = pytest.mark.skipif(_can_compile() is not None, reason=str(_can_compile()))
TINY = ["--model.arch.dim", "16", "--model.arch.depth", "2", "--model.arch.heads", "2", "--trainer.accelerator", "cpu"]


@pytest.mark.long
@pytest.mark.lowest  # (torch 2.11's Inductor: pyproject.toml)
@needs_compile
def test_compiled_and_eager_logits_agree():
    torch.manual_seed(0)
    model = vit.VisionTransformer(vit.ViTConfig(image_size=16, patch_size=4, dim=32, depth=2, heads=2)).eval()
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        eager = model(x)
        model.compile()
        compiled = model(x)
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)
    assert set(model.state_dict()) == set(vit.VisionTransformer(vit.ViTConfig(image_size=16, patch_size=4, dim=32, depth=2,
                                                                 heads=2)).state_dict())  # same keys


@needs_compile
@pytest.mark.long
@pytest.mark.lowest  # (torch 2.11's Inductor: pyproject.toml)
def test_fast_recipe_compiles_once_per_image_size_and_equals_eager(tmp_path, fake_cifar_session, monkeypatch):
    """8 steps of vit_cifar10_fast in fp32: 2 at 16 px, 2 at 24 px, 4 at 32 px, then validation. The
    compiled run (inductor's random ops as eager's, so that token dropping, stochastic depth and
    Mixup/CutMix draw alike) ends with the eager run's weights, to 1e-3 of each weight's update (inductor's
    fp32 kernels sum in another order: up to 1.8e-4 measured, 2026-11-23, 2-core AMD EPYC); with
    AdamW, since timm's Muon orthogonalises in bf16, where a last-bit difference in a gradient flips
    roundings (0.9 % to 5.6 % of an update, by the data's draws: no margin to assert); Muon compiled runs
    in the next test. Dynamo compiles the step once per image size and the model once for evaluation (no graph
    break: E_pos's resampling is traced too)."""
    import torch._dynamo
    import torch._inductor.config

    from vit.commands.train import main

    weights = {}
    from vit.training.module import ViTClassifier
    from vit.models.model import ViTConfig

    torch.manual_seed(0)  # the runs' own start (seed_everything 0), to measure each weight's update
    start = ViTClassifier(ViTConfig(dim=16, depth=2, heads=2, mlp_ratio=2.0)).model.state_dict()
    initial = {f"model.{k}": v.clone() for k, v in start.items()}
    # inductor's random ops as eager's (a context, not a patch of the module: torch's config refuses to be set back)
    with torch._inductor.config.patch(fallback_random=True):
        for compiled in (False, True):
            monkeypatch.chdir(tmp_path)
            torch._dynamo.reset()
            torch._dynamo.utils.counters.clear()
            code = main(["--config", "vit_cifar10_fast", *TINY, "--trainer.precision", "32-true", "--model.optimizer.name", "adamw",
                         "--model.compile", str(compiled).lower(), "--data.root", str(fake_cifar_session),
                         "--data.val_size", "100", "--data.num_workers", "0", "--data.batch_size", "50",
                         "--trainer.max_steps", "8", "--trainer.num_sanity_val_steps", "0", "--trainer.logger", "false",
                         "--test_after_fit", "false", "--run", f"compiled-{compiled}",
                         "--trainer.enable_model_summary", "false"])  # (the recipe's own bar: lines, not a terminal)
            assert code == 0
            frames = dict(torch._dynamo.utils.counters["frames"])
            weights[compiled] = load(tmp_path / "runs" / "vit_cifar10_fast" / f"compiled-{compiled}" / "checkpoints" /
                                     "last.ckpt")["state_dict"]
    counters = torch._dynamo.utils.counters
    # graphs: the step's loss (the model's forward in it) at 16, 24, 32 px, the model in evaluation; AutoAugment
    # (32 px, as stored); random erasing at 16, 24, 32 px; the divergence guard's watch
    assert frames["ok"] == frames["total"], frames
    assert counters["stats"]["unique_graphs"] == 9 and not counters["graph_break"], dict(counters["graph_break"])
    for key, eager in ((k, v) for k, v in weights[False].items() if k in initial):
        compiled, start = weights[True][key], initial[key]
        moved = (eager - start).norm()
        error = (compiled - eager).norm() / moved if moved > 0 else (compiled - eager).norm()
        assert error < 1e-3, f"{key}: compiled differs from eager by {error:.2e} of its update"


@needs_compile
@pytest.mark.long
@pytest.mark.lowest  # (torch 2.11's Inductor: pyproject.toml)
def test_fast_recipe_as_a_user_runs_it_bf16_compiled_with_muon(tmp_path, fake_cifar_session):
    """`train.py --config vit_cifar10_fast` with the recipe's own settings — bf16-mixed, torch.compile, Muon,
    the device data path, 16/24/32-px stages, time to accuracy — at a small width on CPU."""
    env = {**os.environ, "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
    env.pop("WANDB_MODE", None)
    env.pop("WANDB_API_KEY", None)
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "--config", "vit_cifar10_fast", *TINY,
                           "--data.root", str(fake_cifar_session), "--data.val_size", "100", "--data.num_workers", "0",
                           "--data.batch_size", "50", "--trainer.max_epochs", "1"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stderr + proc.stdout
    switches = [int(s) for s in re.findall(r"step (\d+): training on (?:24|32)-px images", out)]
    assert "step 0: training on 16-px images" in out and len(switches) == 2 and switches[0] < switches[1]
    run = tmp_path / "runs" / "vit_cifar10_fast" / "version_0"
    config = (run / "config.yaml").read_text()
    for setting in ("precision: bf16-mixed", "compile: true", "pipeline: device"):
        assert setting in config, setting
    assert yaml.safe_load(config)["model"]["optimizer"]["name"] == "muon"
    record = json.loads((run / "results.json").read_text())
    assert record["test_top1"] == float(re.search(TEST_LINE, out).group(3))
    assert "time_to_val_acc" in record and record["steps"] == 400 // 50  # 2 steps at 16 px, 2 at 24, 4 at 32
    assert all(torch.isfinite(w).all() for w in load(run / "checkpoints" / "last.ckpt")["state_dict"].values())


@needs_compile
@pytest.mark.lowest  # (torch 2.11's Inductor: pyproject.toml)
def test_the_divergence_guards_compiled_watch_keeps_eagers_values_in_one_graph():
    """StopOnNonFinite's watch over a run's steps (a NaN loss at step 3, an inf gradient norm at step 5): the
    compiled graph (a compiled recipe's) keeps the first bad step and the last finite loss as eager does, and
    compiles once whatever the step number."""
    import torch._dynamo

    from vit.training.guards import watch

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(watch, fullgraph=True, dynamic=True)
    losses = [2.0, 1.5, 1.2, float("nan"), 1.0, 0.9]
    norms = [1.0, 1.0, 1.0, 1.0, 1.0, float("inf")]
    for start in (0, 2):  # a NaN first seen at step 3, or (from step 4 on) an inf norm first seen at step 5
        state = {f: (torch.tensor(-1), torch.tensor(float("nan"))) for f in (watch, compiled)}
        for step in range(start * 2, len(losses)):
            for f in (watch, compiled):
                state[f] = f(torch.tensor(losses[step]), torch.tensor(norms[step]), *state[f], step)
        (bad, last), (bad_c, last_c) = state[watch], state[compiled]
        assert int(bad) == int(bad_c) == (3 if start == 0 else 5)
        assert float(last) == float(last_c) == pytest.approx(1.2 if start == 0 else 1.0)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
