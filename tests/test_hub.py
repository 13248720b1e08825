"""A trained model in the timm / Hugging Face world: timm's Hub layout both ways, ONNX, fine-tuning."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import run_here


ROOT = Path(__file__).resolve().parents[1]


def run(script, *args, env=None):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / script), *map(str, args)], capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def timm_folder(trained_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "vit-cifar"
    proc = run("export.py", "--checkpoint", trained_checkpoint, "--output", out, "--format", "timm")
    assert proc.returncode == 0, proc.stderr
    return out


def test_timm_loads_the_export_with_equal_logits_labels_and_preprocessing(trained_checkpoint, timm_folder):
    import timm
    from timm.data import create_transform, resolve_data_config

    from vit.inference.classifier import load_classifier

    ours = load_classifier(trained_checkpoint)
    theirs = timm.create_model(f"local-dir:{timm_folder}", pretrained=True).eval()
    images = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8)
    with torch.no_grad():
        x = ours.normalize(images)
        torch.testing.assert_close(theirs(x), ours.model(x), atol=1e-5, rtol=1e-5)
    config = json.loads((timm_folder / "config.json").read_text())
    assert config["label_names"] == ours.class_names and config["num_classes"] == 10
    assert config["pretrained_cfg"]["mean"] == pytest.approx(list(ours.meta.mean))
    # timm's own preprocessing of a file reproduces ours: exactly for a 32×32 image, closely after a resize
    transform = create_transform(**resolve_data_config({}, model=theirs))
    for size, tolerance in (((32, 32), 1e-6), ((45, 61), 0.1)):
        pixels = np.random.default_rng(0).integers(0, 256, (*size, 3), dtype=np.uint8)
        image = Image.fromarray(pixels)
        ours_x = ours.normalize(ours.preprocess(torch.from_numpy(pixels).permute(2, 0, 1))[None])[0]
        theirs_x = transform(image)
        assert theirs_x.shape == ours_x.shape
        assert (theirs_x - ours_x).abs().mean() < tolerance  # in normalised units; std ≈ 0.25 → ≈ 2.5 levels of 255


def test_model_card_and_classify_from_the_folder(trained_checkpoint, timm_folder, tmp_path):
    card = (timm_folder / "README.md").read_text()
    assert "library_name: timm" in card and "airplane, automobile" in card and "local-dir:" in card
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    by_folder = run("classify.py", "--checkpoint", f"local-dir:{timm_folder}", tmp_path / "a.png", "--json")
    by_ckpt = run_here("classify.py", "--checkpoint", trained_checkpoint, tmp_path / "a.png", "--json")
    assert by_folder.returncode == 0, by_folder.stderr
    assert json.loads(by_folder.stdout) == json.loads(by_ckpt.stdout)
    proc = run_here("classify.py", "--checkpoint", f"local-dir:{tmp_path}", tmp_path / "a.png")
    assert proc.returncode == 2 and "config.json is missing" in proc.stderr and "Traceback" not in proc.stderr


def test_push_to_hub_without_a_token_is_one_line(trained_checkpoint, tmp_path, monkeypatch):
    for key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))  # no login
    proc = run_here("export.py", "--checkpoint", trained_checkpoint, "--output", tmp_path / "out", "--push-to-hub",
                    "someone/vit-cifar")
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: no Hugging Face token"), proc.stderr
    assert proc.stderr.count("\n") == 1


def test_push_to_hub_uploads_the_folder(trained_checkpoint, tmp_path, monkeypatch):
    """Everything up to the upload call: the call itself needs the Hub, which no machine here reaches."""
    import huggingface_hub

    from vit.commands.export import main

    calls = []
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, repo, **kw: calls.append(("create", repo)))
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder",
                        lambda self, **kw: calls.append(("upload", kw["repo_id"], sorted(os.listdir(kw["folder_path"])))))
    assert main(["--checkpoint", str(trained_checkpoint), "--output", str(tmp_path / "out"),
                 "--push-to-hub", "someone/vit-cifar"]) == 0
    assert calls == [("create", "someone/vit-cifar"),
                     ("upload", "someone/vit-cifar", ["README.md", "config.json", "model.safetensors"])]
    assert 'timm.create_model("hf-hub:someone/vit-cifar"' in (tmp_path / "out" / "README.md").read_text()


@pytest.mark.long
def test_onnx_is_one_file_taking_uint8_images(trained_checkpoint, tmp_path):
    import onnx
    import onnxruntime

    from vit.inference.classifier import load_classifier

    assert run_here("export.py", "--checkpoint", trained_checkpoint,
                    "--output", tmp_path / "model.safetensors").returncode == 0
    sidecar = (tmp_path / "model.json").read_text()
    proc = run("export.py", "--checkpoint", trained_checkpoint, "--output", tmp_path / "model.onnx")
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["model.json", "model.onnx", "model.safetensors"]  # no .onnx.data
    assert (tmp_path / "model.json").read_text() == sidecar  # the safetensors export's sidecar, untouched
    ours = load_classifier(trained_checkpoint)
    images = torch.randint(0, 256, (5, 3, 32, 32), dtype=torch.uint8)
    (logits,) = onnxruntime.InferenceSession(str(tmp_path / "model.onnx")).run(None, {"images": images.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(logits, ours.model(ours.normalize(images)).numpy(), atol=1e-4, rtol=1e-4)
    props = {p.key: p.value for p in onnx.load(str(tmp_path / "model.onnx")).metadata_props}
    assert json.loads(props["class_names"]) == ours.class_names


def test_onnx_without_its_extra_is_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    """`make install` leaves the ONNX extra out: the export says how to add it, before reading the checkpoint."""
    from vit.commands.export import main

    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as where the onnx extra is not installed
    assert main(["--checkpoint", str(tmp_path / "nowhere.ckpt"), "--output", str(tmp_path / "model.onnx")]) == 2
    assert capsys.readouterr().err == ("error: the ONNX export needs onnxscript: make install EXTRAS=onnx (or pip "
                                       "install 'vit-lightning[onnx]')\n")
    assert list(tmp_path.iterdir()) == []


def test_finetune_from_a_timm_folder_takes_its_weights_and_normalisation(timm_folder):
    from types import SimpleNamespace

    from vit.models.model import ViTConfig
    from vit.training.module import ViTClassifier

    config = json.loads((timm_folder / "config.json").read_text())
    source = f"local-dir:{timm_folder}"
    module = ViTClassifier(ViTConfig(dim=64, depth=4, heads=4, mlp_ratio=2.0, num_classes=3), pretrained=source)
    assert list(module.hparams.mean) == pytest.approx(config["pretrained_cfg"]["mean"])
    module._trainer = SimpleNamespace(ckpt_path=None, datamodule=None)
    module.setup("fit")
    from safetensors.torch import load_file

    weights = load_file(timm_folder / "model.safetensors")
    torch.testing.assert_close(module.model.blocks[0].attn.out_proj.weight, weights["blocks.0.attn.proj.weight"])
    assert module.model.head.weight.shape == (3, 64)  # a new head for 3 classes
    overridden = ViTClassifier(ViTConfig(dim=64, depth=4, heads=4, mlp_ratio=2.0), pretrained=source, mean=(0.5,) * 3, std=(0.5,) * 3)
    assert overridden.hparams.mean == (0.5,) * 3
