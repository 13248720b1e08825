"""`scripts/classify.py`, `scripts/rollout.py` and `scripts/export.py` end to end, on a real checkpoint."""

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import run_here

ROOT = Path(__file__).resolve().parents[1]


def run(script, *args, timeout=300):
    """README's command end to end, in a subprocess."""
    return subprocess.run([sys.executable, str(ROOT / "scripts" / script), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(d / "photo.png")
    Image.fromarray(rgb).save(d / "photo.jpg", quality=90)
    Image.fromarray(rgb[..., 0]).save(d / "grey.png")
    Image.fromarray(np.dstack([rgb, np.full((40, 50), 128, np.uint8)])).save(d / "alpha.png")
    Image.fromarray(rgb).convert("P").save(d / "palette.gif")
    Image.fromarray(rgb).save(d / "photo.bmp")
    Image.fromarray(rgb).save(d / "photo.webp")
    Image.fromarray((rng.integers(0, 65536, (30, 30))).astype(np.uint16)).save(d / "deep16.png")
    frames = [Image.fromarray(rgb), Image.fromarray(255 - rgb)]
    frames[0].save(d / "anim.gif", save_all=True, append_images=frames[1:])
    Image.fromarray(rgb[:1, :1]).save(d / "tiny.png")
    Image.fromarray(rng.integers(0, 256, (1500, 2000, 3), dtype=np.uint8)).save(d / "large.jpg")
    bad = tmp_path_factory.mktemp("bad")
    (bad / "truncated.png").write_bytes((d / "photo.png").read_bytes()[:200])
    (bad / "empty.jpg").write_bytes(b"")
    (bad / "notes.png").write_text("not an image at all")
    Image.new("1", (12000, 12000)).save(bad / "bomb.png")  # 144 Mpx: over PIL's decompression-bomb limit
    return d, bad


GOOD = ["alpha.png", "anim.gif", "deep16.png", "grey.png", "large.jpg", "palette.gif", "photo.bmp", "photo.jpg",
        "photo.png", "photo.webp", "tiny.png"]


def test_text_output_one_line_per_image_with_top_k(trained_checkpoint, images):
    good, _ = images
    proc = run("classify.py", "--checkpoint", trained_checkpoint, good, "--top-k", "2")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert sorted(Path(line.split(": ")[0]).name for line in lines) == GOOD
    for line in lines:
        preds = line.split(": ", 1)[1].split(" , ")
        assert len(preds) == 2
        probs = [float(p.rsplit("(", 1)[1].rstrip(")")) for p in preds]
        assert 0 <= probs[1] <= probs[0] <= 1


def test_json_and_bad_inputs_keep_the_good_results(trained_checkpoint, images):
    good, bad = images
    proc = run_here("classify.py", "--checkpoint", trained_checkpoint, good / "photo.png", bad, good / "missing.png",
                    good / "grey.png", "--json", "--batch-size", "1")
    assert proc.returncode == 1, proc.stderr
    results = {Path(r["image"]).name: r for r in json.loads(proc.stdout)}
    for name in ("photo.png", "grey.png"):
        preds = results[name]["predictions"]
        assert len(preds) == 3 and preds[0]["label"] in {"cat", "dog", "ship", "truck", "frog", "horse", "deer",
                                                          "bird", "airplane", "automobile"}
        assert sum(p["probability"] for p in preds) <= 1.0001
    assert "decompression bomb" in results["bomb.png"]["error"]
    assert "no such file" in results["missing.png"]["error"]
    assert "empty file" in results["empty.jpg"]["error"]
    for name in ("truncated.png", "notes.png"):
        assert "not a readable image" in results[name]["error"]
    assert "Traceback" not in proc.stderr


def test_text_mode_errors_are_one_line_each_on_stderr(trained_checkpoint, images):
    good, bad = images
    proc = run_here("classify.py", "--checkpoint", trained_checkpoint, bad / "notes.png", good / "photo.png")
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "notes.png: error:" in proc.stderr
    assert proc.stdout.startswith(str(good / "photo.png"))


def test_probabilities_match_validation_preprocessing(trained_checkpoint, fake_cifar_session, tmp_path):
    from vit.data.datamodules import CIFAR10DataModule
    from vit.training.module import ViTClassifier

    ckpt = torch.load(trained_checkpoint, weights_only=True)
    model = ViTClassifier(**{k: v for k, v in ckpt["hyper_parameters"].items() if not k.startswith("_")}).eval()
    model.load_state_dict(ckpt["state_dict"])
    dm = CIFAR10DataModule(root=str(fake_cifar_session), val_size=100, num_workers=0)
    dm.setup("fit")
    image, _ = dm.val_set[0]
    Image.fromarray(image.permute(1, 2, 0).numpy()).save(tmp_path / "val0.png")
    proc = run_here("classify.py", "--checkpoint", trained_checkpoint, tmp_path / "val0.png", "--json", "--top-k", "10")
    preds = json.loads(proc.stdout)[0]["predictions"]
    with torch.no_grad():
        expected = model(image[None]).softmax(-1)[0]
    for p in preds:
        assert p["probability"] == pytest.approx(expected[ckpt["vit"]["class_names"].index(p["label"])].item(), abs=1e-4)
    # --tta-flip: the mean of the logits of the image and of its mirror image, not the plain probabilities
    proc = run_here("classify.py", "--checkpoint", trained_checkpoint, tmp_path / "val0.png", "--json", "--top-k", "10",
                    "--tta-flip")
    flipped = json.loads(proc.stdout)[0]["predictions"]
    with torch.no_grad():
        expected_tta = ((model(image[None]) + model(image[None].flip(-1))) / 2).softmax(-1)[0]
    # (apart by more than the check's tolerance plus classify's rounding, so that the check tells them apart)
    assert (expected - expected_tta).abs().max() > 2.5e-4
    for p in flipped:
        assert p["probability"] == pytest.approx(expected_tta[ckpt["vit"]["class_names"].index(p["label"])].item(),
                                                 abs=1e-4)


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_bad_checkpoints_exit_2_with_one_line(trained_checkpoint, images, tmp_path):
    good, _ = images
    marker = tmp_path / "pwned"
    torch.save({"state_dict": {}, "vit": _Exploit(marker)}, tmp_path / "evil.ckpt")
    (tmp_path / "corrupt.ckpt").write_bytes(os.urandom(4096))
    torch.save({"weights": torch.zeros(3)}, tmp_path / "foreign.ckpt")
    ckpt = torch.load(trained_checkpoint, weights_only=True)
    ckpt["vit"]["config"]["dim"] = 96
    torch.save(ckpt, tmp_path / "mismatch.ckpt")
    cases = {"evil.ckpt": "refused", "corrupt.ckpt": "not a readable checkpoint", "foreign.ckpt": "not a vit",
             "mismatch.ckpt": "incompatible", "absent.ckpt": "no such checkpoint file"}
    for name, message in cases.items():
        proc = run_here("classify.py", "--checkpoint", tmp_path / name, good / "photo.png")
        assert proc.returncode == 2, (name, proc.stderr)
        assert message in proc.stderr and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, name
    assert not marker.exists()  # the crafted pickle did not run
    pickle.loads(pickle.dumps(_Exploit(marker)))  # while plain unpickling would have run it
    assert marker.exists()


def test_classify_path_does_not_import_lightning_or_wandb():
    code = "import sys, vit.commands.classify, vit.commands.rollout, vit.commands.export; print(sorted(m for m in ('lightning', 'wandb', 'timm') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip() == "[]", proc.stderr


def test_export_round_trip_safetensors(trained_checkpoint, images, tmp_path):
    from vit.inference.classifier import load_classifier

    good, _ = images
    reference = load_classifier(trained_checkpoint)
    x = reference.normalize(torch.stack([reference.preprocess(torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8))
                                         for _ in range(5)]))
    with torch.no_grad():
        expected = reference.model(x)

    proc = run("export.py", "--checkpoint", trained_checkpoint, "--output", tmp_path / "model.safetensors")
    assert proc.returncode == 0, proc.stderr
    exported = load_classifier(tmp_path / "model.safetensors")
    assert exported.class_names == reference.class_names and json.loads((tmp_path / "model.json").read_text())["mean"]
    with torch.no_grad():
        torch.testing.assert_close(exported.model(x), expected, rtol=0, atol=0)
    by_export = run_here("classify.py", "--checkpoint", tmp_path / "model.safetensors", good / "photo.png", "--json")
    by_ckpt = run_here("classify.py", "--checkpoint", trained_checkpoint, good / "photo.png", "--json")
    assert json.loads(by_export.stdout) == json.loads(by_ckpt.stdout)


def test_rollout_cli_writes_a_figure_per_image(trained_checkpoint, images, tmp_path):
    good, bad = images
    out = tmp_path / "figures"
    proc = run("rollout.py", "--checkpoint", trained_checkpoint, good / "photo.jpg", good / "grey.png",
               bad / "notes.png", "--output-dir", out, "--discard-ratio", "0.9", "--head-fusion", "max")
    assert proc.returncode == 1 and "notes.png: error" in proc.stderr
    for name in ("photo_rollout.png", "grey_rollout.png"):
        with Image.open(out / name) as fig:
            assert fig.width > 3 * fig.height / 2  # three panels side by side
    proc = run_here("rollout.py", "--checkpoint", trained_checkpoint, good / "photo.png", "--output-dir", out,
                    "--method", "gradient", "--class", "cat")
    assert proc.returncode == 0 and "why cat (" in proc.stdout
    proc = run_here("rollout.py", "--checkpoint", trained_checkpoint, good / "photo.png", "--output-dir", out,
                    "--class", "unicorn")
    assert proc.returncode == 2 and "unicorn" in proc.stderr


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_classify_at_scale_writes_results_in_input_order(trained_checkpoint, images, tmp_path, fmt):
    """Many images through 2 decoding workers, bad files among them: every file gets its row, in order.
    README's command (--output results.csv) in a subprocess, the json output in this process."""
    import csv

    good, bad = images
    folder = tmp_path / "many"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(90):
        Image.fromarray(rng.integers(0, 256, (20 + i, 30, 3), dtype=np.uint8)).save(folder / f"{i:03d}.png")
    (folder / "045b.png").write_text("not an image")
    out = tmp_path / f"results.{fmt}"
    proc = (run if fmt == "csv" else run_here)("classify.py", "--checkpoint", trained_checkpoint, folder,
                                               bad / "empty.jpg", "--workers", "2", "--batch-size", "16", "--top-k",
                                               "2", "--output", out)
    assert proc.returncode == 1, proc.stderr
    expected = [str(p) for p in sorted(folder.iterdir())] + [str(bad / "empty.jpg")]
    if fmt == "csv":
        rows = list(csv.DictReader(out.open()))
        assert list(rows[0]) == ["path", "label_1", "probability_1", "label_2", "probability_2", "error"]
        assert [r["path"] for r in rows] == expected
        errors = {Path(r["path"]).name: r["error"] for r in rows if r["error"]}
        assert all(r["label_1"] and float(r["probability_1"]) >= float(r["probability_2"]) for r in rows if not r["error"])
    else:
        rows = json.loads(out.read_text())
        assert [r["image"] for r in rows] == expected
        errors = {Path(r["image"]).name: r["error"] for r in rows if "error" in r}
    assert set(errors) == {"045b.png", "empty.jpg"} and "empty file" in errors["empty.jpg"]
    assert "wrote 92 results (2 errors)" in proc.stderr and "%|" in proc.stderr  # the progress bar
    # the same answers as one process classifying them
    single = run_here("classify.py", "--checkpoint", trained_checkpoint, folder, bad / "empty.jpg", "--workers", "0",
                      "--top-k", "2", "--json")
    by_path = {r["image"]: r for r in json.loads(single.stdout)}
    if fmt == "json":
        assert rows == [by_path[p] for p in expected]
