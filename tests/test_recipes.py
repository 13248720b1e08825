"""Every recipe in configs/ trains a few steps on CPU with its own settings (precision, augmentation,
Mixup/CutMix, Muon, workers, resize stages), then tests: a recipe nobody ran can crash at its first step.
vit_cifar10_fast (torch.compile) runs as a user runs it in tests/test_compile.py; vit_cifar10 and vit_tiny_cifar10,
whose compile is that recipe's, run eager here."""

import re

import pytest
import torch
import yaml

from vit import configs
from helpers import ROOT, TEST_LINE

HERE = ["smoke", "cpu", "vit_cifar10", "vit_cifar10_lee", "vit_tiny_cifar10", "finetune_cifar10"]


def test_every_recipe_is_run_by_a_test():
    assert set(configs.names()) == set(HERE) | {"vit_cifar10_fast"}


@pytest.fixture(scope="module")
def small_cifar(tmp_path_factory):
    """200 training and 60 test images, more than a test batch of any recipe here (each tests one batch)."""
    from helpers import make_fake_cifar

    return make_fake_cifar(tmp_path_factory.mktemp("small") / "data", per_batch=40, test_size=60)


FP32 = ("smoke", "cpu")  # the others are bf16-mixed: emulated, and minutes long, on CPUs without bf16 units


@pytest.mark.parametrize("recipe", [r if r in FP32 else pytest.param(r, marks=pytest.mark.long) for r in HERE])
def test_a_recipe_trains_a_few_steps_with_its_own_settings(recipe, tmp_path, small_cifar, monkeypatch, caplog):
    """vit-train's main() in this process (the command itself runs in test_train.py and test_compile.py)."""
    from vit.commands.train import main

    extra = []
    if recipe == "finetune_cifar10":  # its timm weights, randomly initialised (no download here)
        import timm

        weights = tmp_path / "vit_small_patch16_224.pth"
        torch.save(timm.create_model("vit_small_patch16_224", pretrained=False).state_dict(), weights)
        extra = ["--model.pretrained", str(weights)]
    if recipe in ("vit_cifar10", "vit_tiny_cifar10"):  # compiled as a user runs it in tests/test_compile.py: the
        extra = ["--model.compile", "false"]  # fast recipe is this one with resize stages (a compile: minutes)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.chdir(tmp_path)
    # The bf16-mixed recipes (all but smoke and cpu) take batches of 2 (Mixup's pairs; finetune has no Mixup:
    # 1): a CPU without bf16 units (AVX-512 BF16, AMX) emulates bf16 matmuls, 56 times slower than fp32 on a
    # 2-core AMD EPYC with AVX2 only (2026-11-24)
    batch = {"smoke": "50", "cpu": "50", "finetune_cifar10": "1"}.get(recipe, "2")
    code = main(["--config", recipe, *extra, "--data.root", str(small_cifar), "--data.val_size", "50",
                 "--data.batch_size", batch, "--trainer.max_steps", "2", "--trainer.max_epochs", "1",
                 "--trainer.limit_val_batches", "1", "--trainer.limit_test_batches", "1"])
    assert code == 0, caplog.text[-3000:]
    assert re.search(TEST_LINE, caplog.text), caplog.text[-2000:]
    # the test's one batch (--trainer.limit_test_batches 1), said as such: the test set has more images
    tested, total = map(int, re.search(r"test on (\d+) images \(of (\d+): --trainer.limit_test_batches\)",
                                       caplog.text).groups())
    assert 0 < tested <= int(batch) < total
    ran = yaml.safe_load((tmp_path / "runs" / recipe / "version_0" / "config.yaml").read_text())
    own = yaml.safe_load((ROOT / "configs" / f"{recipe}.yaml").read_text())
    for key, value in (own.get("model") or {}).items():  # the recipe's own model settings are what ran
        if f"--model.{key}" not in extra:  # what this test sets itself
            assert ran["model"][key] == value or (isinstance(value, dict) and value.items() <= ran["model"][key].items()) \
                or (isinstance(value, list) and [list(v) for v in value] == ran["model"][key]), (key, value)
    if "precision" in (own.get("trainer") or {}):
        assert ran["trainer"]["precision"] == own["trainer"]["precision"]
