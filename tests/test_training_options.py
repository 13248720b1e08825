"""Accuracy-per-FLOP options of the recipe: Muon for the blocks' matrices, progressive resizing, token
dropping (timm's PatchDropout), an EMA of the weights (timm's ModelEmaV3). One run with all of them on, through
vit-train's main() in this process: the EMA weights are the ones tested, classified and exported, and the
checkpoint classifies at full size. That these runs resume bit-exact, mid-epoch and across the resize
switches, is tests/test_resume.py's matrix."""

import re
from pathlib import Path

import pytest
import torch

from helpers import TEST_LINE, load, train_here


# 16 steps, 8 per epoch: 16 px for steps 0-3, 24 px for 4-11, 32 px for 12-15; the smoke model at half its width
# and depth (the options' checks do not depend on its size)
LEVERS = ["--model.optimizer.name", "muon", "--model.ema_decay", "0.9", "--model.arch.patch_drop", "0.25",
          "--model.schedule.resize_stages", "[[16, 0.25], [24, 0.75]]", "--trainer.max_epochs", "2", "--data.num_workers", "0",
          "--trainer.logger", "false", "--model.arch.dim", "32", "--model.arch.depth", "2", "--model.arch.heads", "2"]


@pytest.fixture(scope="module")
def options_run(tmp_path_factory, fake_cifar_session):
    """The run folder and the test line of one run with every option on."""
    import logging

    full = tmp_path_factory.mktemp("full")
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger().addHandler(handler)
    try:
        assert train_here(full, fake_cifar_session, *LEVERS) == 0
    finally:
        logging.getLogger().removeHandler(handler)
    (tested,) = [line for line in lines if re.search(TEST_LINE, line)]
    return full, tested


def test_the_options_train_to_full_size_with_muon_and_the_ema(options_run):
    full, _ = options_run
    a = load(full / "runs/smoke/version_0/checkpoints/last.ckpt")
    assert a["global_step"] == 16 and a["schedule"]["share"] == 1.0
    assert any(k.startswith("ema.module.") for k in a["state_dict"])  # the EMA and the raw weights, both kept
    assert a["state_dict"]["model.pos_embedding"].shape == (1, 65, 32)  # full size: 32 px, patch 4 (dim 32)
    (state,) = a["optimizer_states"]
    assert [g.get("use_fallback", False) for g in state["param_groups"]] == [False, True, True]  # Muon, AdamW ×2


def test_the_ema_weights_are_tested_classified_and_exported(options_run, fake_cifar_session, tmp_path):
    from vit.data.datamodules import CIFAR10DataModule
    from vit.inference.classifier import load_classifier
    from vit.training.module import ViTClassifier

    full, tested_line = options_run
    (best,) = (full / "runs/smoke/version_0/checkpoints").glob("best-*.ckpt")
    ckpt = load(best)
    ema = {k.removeprefix("ema.module."): v for k, v in ckpt["state_dict"].items() if k.startswith("ema.module.")}
    raw = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    assert ema.keys() == raw.keys() and any(not torch.equal(ema[k], raw[k]) for k in ema)

    classifier = load_classifier(best)  # what classify and export read
    for key, value in classifier.model.state_dict().items():
        assert torch.equal(value, ema[key]), key

    model = ViTClassifier(**{k: v for k, v in ckpt["hyper_parameters"].items() if not k.startswith("_")})
    model.load_state_dict(ckpt["state_dict"])
    dm = CIFAR10DataModule(root=str(fake_cifar_session), val_size=100, num_workers=0, batch_size=50)
    dm.setup("test")
    model.eval()
    with torch.no_grad():
        accuracy = {name: sum((net(model.normalize(x)).argmax(-1) == y).sum().item()
                              for x, y in dm.test_dataloader()) / len(dm.test_set)
                    for name, net in (("ema", model.ema.module), ("raw", model.model))}
    tested = float(re.search(TEST_LINE, tested_line).group(3))
    assert tested == pytest.approx(100 * accuracy["ema"], abs=0.005)


def test_muon_takes_exactly_the_blocks_matrices():
    from vit.models.model import ViTConfig
    from vit.training.module import OptimizerConfig, ViTClassifier

    module = ViTClassifier(arch=ViTConfig(dim=32, depth=3, heads=2), optimizer=OptimizerConfig(name="muon"))
    muon, decay, rest = module.param_groups(1e-3, 0.02)
    names = {id(p): n for n, p in module.model.named_parameters()}
    under_muon = sorted(names[id(p)] for p in muon["params"])
    expected = sorted(f"blocks.{i}.{w}" for i in range(3)
                      for w in ("attn.qkv.weight", "attn.out_proj.weight", "mlp.fc1.weight", "mlp.fc2.weight"))
    assert under_muon == expected
    assert sorted(names[id(p)] for p in decay["params"]) == ["head.weight", "patch_embedding.proj.weight"]
    assert {names[id(p)] for p in rest["params"]} == module.model.no_weight_decay()
    assert rest["weight_decay"] == 0 and decay["use_fallback"] and rest["use_fallback"]
    assert len(muon["params"]) + len(decay["params"]) + len(rest["params"]) == len(list(module.model.parameters()))


def test_muon_runs_newton_schulz_in_the_dtype_asked_and_leaves_timm_as_it_was():
    """The step's update is timm's Newton–Schulz in float32 (not its bfloat16 default), timm's function is
    restored after the step, and the recipe's is float32 on a CPU, bfloat16 on a GPU."""
    import timm.optim.muon as timm_muon

    from vit.training.optim import Muon, ns_dtype

    assert ns_dtype(torch.device("cpu")) == torch.float32 and ns_dtype(torch.device("cuda")) == torch.bfloat16
    torch.manual_seed(0)
    grad = torch.randn(48, 16)
    updates = {}
    for dtype in (torch.float32, torch.bfloat16):
        weight = torch.nn.Parameter(torch.zeros(48, 16))
        weight.grad = grad.clone()
        before = timm_muon.zeropower_via_newtonschulz
        Muon([weight], lr=1.0, momentum=0.0, ns_dtype=dtype, adjust_lr_fn=None).step()
        assert timm_muon.zeropower_via_newtonschulz is before
        updates[dtype] = -weight.detach()
    expected = timm_muon.zeropower_via_newtonschulz(grad, 5, timm_muon.resolve_ns_coefficients("quintic", timm_muon._COEFFICIENTS),
                                                    dtype=torch.float32)
    torch.testing.assert_close(updates[torch.float32], expected, rtol=0, atol=1e-6)
    # bfloat16's update differs from float32's by its rounding (8 bits of mantissa), far above float32's
    assert (updates[torch.bfloat16] - expected).abs().max() > 1e-3


def test_a_progressive_resizing_checkpoint_classifies_at_full_size(options_run, tmp_path, capsys):
    """classify on the run's last checkpoint: a 32-px image and a larger one, both through the full-size
    model, with the probabilities the in-process 32-px forward gives."""
    import json

    import numpy as np
    from PIL import Image

    from vit.commands.classify import main
    from vit.inference.classifier import load_classifier

    full, _ = options_run
    last = full / "runs/smoke/version_0/checkpoints/last.ckpt"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(tmp_path / "small.png")
    Image.fromarray(rng.integers(0, 256, (96, 80, 3), dtype=np.uint8)).save(tmp_path / "large.png")
    code = main(["--checkpoint", str(last), str(tmp_path / "small.png"), str(tmp_path / "large.png"), "--json",
                 "--top-k", "10"])
    out = capsys.readouterr()
    assert code == 0, out.err
    results = json.loads(out.out)
    assert [Path(r["image"]).name for r in results] == ["small.png", "large.png"]
    classifier = load_classifier(last)
    assert classifier.meta.config.image_size == 32
    image = torch.from_numpy(np.array(Image.open(tmp_path / "small.png"))).permute(2, 0, 1)[None]
    with torch.no_grad():
        expected = classifier.model(classifier.normalize(image)).softmax(-1)[0]
    names = classifier.meta.class_names
    for p in results[0]["predictions"]:
        assert p["probability"] == pytest.approx(expected[names.index(p["label"])].item(), abs=1e-4)
