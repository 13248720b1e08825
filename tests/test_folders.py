"""Your own image folders (torchvision ImageFolder underneath), the one image loader, fine-tuning weights."""

import json
import os
import re
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file
from timm.models.vision_transformer import VisionTransformer as TimmViT

from vit.data.datamodules import DatasetError, ImageFolderDataModule
from vit.data.images import check_image, load_image
from vit.inference.classifier import Classifier
from vit.models.model import ViTConfig, VisionTransformer
from vit.training.module import ViTClassifier
from vit.models.preprocessing import Metadata
from helpers import load, write_bad_files, write_images


@pytest.fixture
def folders(tmp_path):
    write_images(tmp_path / "train" / "red", 10, (200, 20, 20))
    write_images(tmp_path / "train" / "blue", 10, (20, 20, 200))
    return tmp_path



def red_and_blue(tmp_path):
    """An image folder of two classes, 16 images each (train/ only), and a tiny model's vit-train arguments for it
    (2 epochs, --data.val_size 0.25)."""
    root = tmp_path / "photos"
    for name, colour in (("red", (200, 20, 20)), ("blue", (20, 20, 200))):
        write_images(root / "train" / name, 16, colour, size=16)
    return root, ["--data", "vit.data.ImageFolderDataModule", "--data.root", str(root), "--data.val_size", "0.25",
                  "--data.batch_size", "8", "--data.num_workers", "0", "--model.arch.image_size", "16",
                  "--model.arch.patch_size", "4", "--model.arch.dim", "16", "--model.arch.depth", "1",
                  "--model.arch.heads", "2", "--trainer.max_epochs", "2"]

def test_default_split_is_a_stratified_tenth_never_empty(folders):
    dm = ImageFolderDataModule(root=str(folders), image_size=32, num_workers=0, batch_size=4)
    assert dm.classes == ["blue", "red"] and dm.num_classes == 2
    dm.setup("fit")
    assert len(dm.train_set) == 18 and len(dm.val_set) == 2 and dm.test_set is dm.val_set
    assert sorted(dm.val_set.dataset.targets[i] for i in dm.val_set.indices) == [0, 1]  # one per class
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.uint8 and set(labels.tolist()) <= {0, 1}


def test_val_and_test_folders_index_classes_as_train_does(folders):
    write_images(folders / "val" / "red", 3, (200, 20, 20))  # no blue/ in val: red must stay class 1
    write_images(folders / "test" / "blue", 2, (20, 20, 200))
    dm = ImageFolderDataModule(root=str(folders), image_size=16, num_workers=0)
    dm.setup("fit")
    assert len(dm.train_set) == 20 and dm.val_set.targets == [1, 1, 1] and dm.test_set.targets == [0, 0]
    write_images(folders / "test" / "green", 1, (20, 200, 20))
    with pytest.raises(DatasetError, match="class folders that train/ lacks: green"):
        ImageFolderDataModule(root=str(folders), num_workers=0).setup("fit")


def test_unreadable_files_are_skipped_and_the_good_ones_all_kept(folders):
    write_bad_files(folders / "train" / "red")
    dm = ImageFolderDataModule(root=str(folders), image_size=16, num_workers=0, val_size=4)
    dm.setup("fit")
    assert sorted(p.rsplit("/", 1)[1] for p in dm.bad_files) == ["empty.png", "notes.png", "truncated.jpg"]
    assert len(dm.train_set) + len(dm.val_set) == 20
    every = [dm.train_set[i] for i in range(len(dm.train_set))] + [dm.val_set[i] for i in range(len(dm.val_set))]
    assert all(sample is not None and sample[0].shape == (3, 16, 16) for sample in every)
    with pytest.raises(DatasetError, match=r"3 of 23 images .* cannot be read: .*empty.png"):
        ImageFolderDataModule(root=str(folders), num_workers=0, on_bad_file="error").setup("fit")


def test_check_image_is_cheap_but_finds_truncation(tmp_path):
    write_bad_files(tmp_path)
    Image.new("RGB", (20, 20)).save(tmp_path / "ok.png")
    (tmp_path / "cut.png").write_bytes((tmp_path / "ok.png").read_bytes()[:60])
    assert check_image(tmp_path / "ok.png") is None
    assert "truncated" in check_image(tmp_path / "truncated.jpg")
    assert check_image(tmp_path / "empty.png") == "empty file"
    for name in ("notes.png", "cut.png"):
        assert "not a readable image" in check_image(tmp_path / name)


def test_exif_orientation_is_applied(tmp_path):
    """A phone photo stored sideways (landscape pixels, orientation tag 6 = rotate 90° clockwise)."""
    pixels = np.zeros((20, 40, 3), np.uint8)  # stored: 20 high, 40 wide; left half red
    pixels[:, :20] = (255, 0, 0)
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(pixels).save(tmp_path / "phone.jpg", exif=exif, quality=95)
    image = load_image(tmp_path / "phone.jpg")
    assert image.shape == (3, 40, 20)  # shown upright: 40 high, 20 wide
    assert image[0, :15].float().mean() > 200 and image[0, 25:].float().mean() < 50  # red on top


def test_classify_input_equals_the_validation_loaders(folders):
    """One preprocessing definition: the tensor classify feeds the model for a file is the tensor the
    validation loader gives for that file."""
    dm = ImageFolderDataModule(root=str(folders), image_size=24, num_workers=0, val_size=6)
    dm.setup("fit")
    config = ViTConfig(image_size=24, patch_size=4, num_classes=2, dim=16, depth=1, heads=2)
    classifier = Classifier(VisionTransformer(config), Metadata(config, dm.classes, (0.5,) * 3, (0.25,) * 3))
    for i in range(len(dm.val_set)):
        path, _ = dm.val_set.dataset.samples[dm.val_set.indices[i]]
        torch.testing.assert_close(classifier.preprocess(load_image(path)), dm.val_set[i][0], rtol=0, atol=0)


def finetune_module(path, **arch):
    module = ViTClassifier(ViTConfig(image_size=48, patch_size=8, dim=48, depth=2, heads=3, **arch),
                           pretrained=str(path))
    module._trainer = SimpleNamespace(ckpt_path=None, datamodule=None)  # what setup("fit") reads
    return module


@pytest.mark.parametrize("fmt", ["pth", "safetensors"])
def test_finetune_loads_timm_weights_at_fit_resampling_pos_embedding(tmp_path, fmt):
    torch.manual_seed(0)
    timm_model = TimmViT(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=1000)
    path = tmp_path / f"weights.{fmt}"
    state = {k: v.contiguous() for k, v in timm_model.state_dict().items()}
    save_file(state, path) if fmt == "safetensors" else torch.save(state, path)
    module = finetune_module(path)  # a 48×48 input with patch 8 has a 6×6 grid, the weights a 4×4 one
    vit = module.model
    assert not torch.equal(vit.cls_token, timm_model.cls_token)  # constructing (or loading a checkpoint) reads nothing
    module.setup("fit")
    assert vit.pos_embedding.shape == (1, 37, 48) and vit.head.weight.shape == (10, 48)
    torch.testing.assert_close(vit.pos_embedding[:, 0], timm_model.pos_embed[:, 0])  # [cls] position kept
    torch.testing.assert_close(vit.blocks[1].attn.out_proj.weight, timm_model.blocks[1].attn.proj.weight)
    torch.testing.assert_close(vit.cls_token, timm_model.cls_token)
    with pytest.raises(ValueError, match="shape mismatch"):
        finetune_module(path, mlp_ratio=2.0).setup("fit")


def test_fashion_mnist_files_become_folders_that_train_py_trains_on(tmp_path):
    """README's `python scripts/folders.py` on Fashion-MNIST's four files (generated, in torchvision's layout),
    then README's training command on the folders it wrote: every image in its class folder, pixels kept,
    the test on test/. A missing file or a non-empty OUT is exit 2 with one line."""
    import subprocess
    import sys

    from helpers import ROOT, TEST_LINE, run_here, train
    from vit.data.folders import write_fake_raw

    root, out = write_fake_raw(tmp_path / "data", per_class=30, test_per_class=10), tmp_path / "folders"
    run = [sys.executable, str(ROOT / "scripts/folders.py"), "--root", str(root), "--out", str(out)]
    proc = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"wrote {out}: train/ 300 images, test/ 100 images"
    classes = sorted(p.name for p in (out / "train").iterdir())
    assert classes == sorted(["T-shirt-top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                              "Ankle boot"])
    assert all(len(list((out / "train" / c).glob("*.png"))) == 30 for c in classes)
    assert sorted(p.name for p in out.parent.iterdir()) == ["data", "folders"]  # no partial folder left
    from torchvision.datasets import FashionMNIST

    first = FashionMNIST(str(root), train=False)
    image = np.asarray(Image.open(out / "test" / "T-shirt-top" / "00000.png"))
    assert first.targets[0] == 0 and np.array_equal(image, first.data[0].numpy())
    trained = train(tmp_path, None, "--data", "vit.data.ImageFolderDataModule", "--data.root", str(out),
                    "--data.val_size", "50", "--data.batch_size", "50", "--data.num_workers", "0",
                    "--trainer.max_epochs", "1", "--trainer.logger", "false")
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert re.search(TEST_LINE, trained.stderr + trained.stdout).group(1) == "100"
    again = run_here("folders.py", *run[2:])  # the refusals: its main() in this process
    assert again.returncode == 2 and again.stderr == f"error: {out} is not empty: give a new folder\n"
    (root / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    missing = run_here("folders.py", *run[2:-1], tmp_path / "new")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "lacks t10k-labels-idx1-ubyte" in missing.stderr and "--download" in missing.stderr


def test_a_download_with_no_route_to_fashion_mnist_is_one_line(tmp_path, monkeypatch, capsys):
    """vit-folders --download where the files' host does not answer (a mirror on a closed local port):
    exit 2 with one line naming where to put the files, not torchvision's traceback after every mirror."""
    from torchvision.datasets import FashionMNIST

    from vit.commands.folders import main

    monkeypatch.setattr(FashionMNIST, "mirrors", ["http://127.0.0.1:9/"])
    assert main(["--root", str(tmp_path), "--out", str(tmp_path / "out"), "--download"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: cannot download Fashion-MNIST: http://127.0.0.1:9/train-images-idx3-ubyte.gz "
                           "does not answer") and line.endswith(f"in {tmp_path}/FashionMNIST/raw")
    assert not (tmp_path / "out").exists()



def test_lightning_ends_the_folder_loaders_workers_with_its_stage_and_the_loader_reads_again():
    """SkipUnreadable hands Lightning the wrapped loader's iterator: CombinedLoader.reset (what Lightning calls
    when a stage ends, a crashed one too) ends the persistent workers, and the loader then reads every batch
    again, with workers of its own until the next reset."""
    import multiprocessing

    from lightning.pytorch.utilities import CombinedLoader
    from torch.utils.data import DataLoader

    from vit.data.datamodules import SkipUnreadable

    before = set(multiprocessing.active_children())
    wrapped = SkipUnreadable(DataLoader(list(range(8)), batch_size=2, num_workers=1, persistent_workers=True), None)
    for _ in range(2):
        combined = CombinedLoader(wrapped, "max_size_cycle")
        next(iter(combined))  # mid-epoch, as a stage that stops or crashes leaves it
        assert set(multiprocessing.active_children()) > before
        combined.reset()
        assert set(multiprocessing.active_children()) <= before
        assert [batch.tolist() for batch in wrapped] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    combined.reset()
    assert set(multiprocessing.active_children()) <= before


def split_of(dm) -> tuple[set[str], set[str]]:
    """The (training, validation) image paths a set-up folder module took."""
    return ({dm.train_set.dataset.samples[i][0] for i in dm.train_set.indices},
            {dm.val_set.dataset.samples[i][0] for i in dm.val_set.indices})


def change_folder(root, trained, held) -> tuple[set[str], set[str]]:
    """Add 21 images (in new subfolders of two classes) and remove 3 trained and 2 held-out ones: (added, removed)."""
    write_images(root / "train" / "red" / "added", 15, (200, 20, 20), size=16, seed=5)
    write_images(root / "train" / "blue" / "added", 6, (20, 20, 200), size=16, seed=6)
    removed = set(sorted(trained)[:3]) | set(sorted(held)[:2])
    for path in removed:
        os.remove(path)
    added = {str(p) for p in (root / "train").rglob("*") if p.parent.name == "added"}
    return added, removed


@pytest.mark.parametrize("val_size", [0.25, 9])
def test_a_resumed_split_holds_out_no_trained_image_when_images_are_added_and_removed(tmp_path, val_size):
    """A checkpoint's split (the data module's state) kept over a changed folder: every image the run trained
    on stays in training, every held-out one still there stays held out, and only added images join either."""
    root = tmp_path / "photos"
    for name, colour in (("red", (200, 20, 20)), ("blue", (20, 20, 200)), ("green", (20, 200, 20))):
        write_images(root / "train" / name, 12, colour, size=16)
    first = ImageFolderDataModule(root=str(root), image_size=16, num_workers=0, val_size=val_size)
    first.setup("fit")
    state = first.state_dict()
    trained, held = split_of(first)
    assert len(held) == 9 and [sorted(first.whole.targets[i] for i in first.val_set.indices).count(c)
                               for c in range(3)] == [3, 3, 3]  # stratified, as configured
    added, removed = change_folder(root, trained, held)
    resumed = ImageFolderDataModule(root=str(root), image_size=16, num_workers=0, val_size=val_size)
    resumed.setup("fit")
    resumed.load_state_dict(state)
    trained_now, held_now = split_of(resumed)
    assert not trained & held_now  # no trained image held out
    assert held - removed <= held_now and held_now - held <= added
    assert trained - removed <= trained_now and trained_now | held_now == (trained | held | added) - removed
    assert resumed.test_set is resumed.val_set and resumed.state_dict()["held_out"] == state["held_out"]
    assert 0 < len(held_now & added) < len(added)  # the added images join both sides (seeded: always these)


def test_a_split_a_resume_cannot_keep_is_refused_in_one_line(tmp_path):
    """vit-train's check of a checkpoint's split (vit.models.checkpoints.check_split, after check_fields has checked
    that it is as written), before the folder is indexed: a --data.val_size that means the same count of the images
    the split was drawn over resumes it."""
    from vit.exits import CheckpointError, ConfigError
    from vit.models.checkpoints import check_fields, check_split

    root = tmp_path / "photos"
    for name, colour in (("red", (200, 20, 20)), ("blue", (20, 20, 200))):
        write_images(root / "train" / name, 10, colour, size=16)

    def resume(state, **kwargs):
        if state is not None:
            data = {"class_path": "vit.data.ImageFolderDataModule", "root": str(root), "val_size": 0.1, "seed": 0}
            ckpt = {"ImageFolderDataModule": state, "callbacks": {"TrainingClock": {}}}
            check_fields(ckpt, "the checkpoint", "ImageFolderDataModule")
            check_split(ckpt, {**data, **kwargs}, "the checkpoint")
        dm = ImageFolderDataModule(root=str(root), image_size=16, num_workers=0, **kwargs)
        dm.setup("fit")
        if state is not None:
            dm.load_state_dict(state)
        return dm

    first = resume(None, val_size=4)
    state = first.state_dict()
    assert state["held_out"]["images"] == 20 and split_of(resume(state, val_size=0.2)) == split_of(first)  # 4 of 20
    with pytest.raises(ConfigError, match=r"^the checkpoint: the run held out 4 of 20 images for validation with "
                                          r"--data.val_size 4 --data.seed 0, and this command has --data.val_size 0.25 "
                                          r"--data.seed 0, which would hold out others, some of them trained on: "
                                          r"resume with --data.val_size 4 --data.seed 0, or start a new run$"):
        resume(state, val_size=0.25)
    with pytest.raises(ConfigError, match="--data.seed 1, which would hold out others.*: resume with --data.val_size 4 "
                                          "--data.seed 0,"):
        resume(state, val_size=4, seed=1)
    for crafted in ({**state["held_out"], "limits": ["0", None]}, {**state["held_out"], "limits": [2**63, 0]}, 7):
        with pytest.raises(CheckpointError) as refused:
            resume({**state, "held_out": crafted}, val_size=4)
        assert str(refused.value) == (f"the checkpoint: not as this program writes it (ImageFolderDataModule.held_out "
                                      f"{repr(crafted)[:40]}): resume from another checkpoint of the run, or start a "
                                      f"new run")
    earlier = {k: v for k, v in state["held_out"].items() if k != "images"}  # (an earlier version's: as written)
    assert split_of(resume({**state, "held_out": earlier}, val_size=4)) == split_of(first)
    with pytest.raises(ConfigError, match=r"^the checkpoint: the run held out its validation images with "
                                          r"--data.val_size 4 --data.seed 0, and this command has --data.val_size 0.2"):
        resume({**state, "held_out": earlier}, val_size=0.2)
    (root / "train" / "blue").rename(root / "train" / "navy")
    with pytest.raises(DatasetError, match=r"the run's classes were blue, red, and .*/train now has navy, red: put "
                                           r"the class folders back as they were, or start a new run$"):
        resume(state, val_size=4)
    (root / "train" / "navy").rename(root / "train" / "blue")
    write_images(root / "val" / "red", 2, (200, 20, 20), size=16)
    with pytest.raises(DatasetError, match=r"the run drew its validation images from .*/train, and .*/val now "
                                           r"exists: remove val/ to resume, or start a new run$"):
        resume(state, val_size=4)
    on_val = resume(None)
    validated_on_val = on_val.state_dict()
    assert validated_on_val["held_out"] == "val/" and on_val.test_set is on_val.val_set and len(on_val.val_set) == 2
    shutil.rmtree(root / "val")
    with pytest.raises(DatasetError, match=r"the run validated on .*/val, which is gone: put it back, or start a "
                                           r"new run \(without val/"):
        resume(validated_on_val)
    assert split_of(resume(state, val_size=4)) == split_of(first)  # the folder as it was: the same split


def test_a_run_resumed_on_a_changed_folder_validates_on_no_image_it_trained_on(tmp_path, caplog):
    """vit-train's main() in this process: epoch 0, then images added and removed, then the resume (epoch 1 and
    the test): the images each start took, as it trained (callbacks.RecordData)."""
    from helpers import TEST_LINE, train_here

    root, args = red_and_blue(tmp_path)
    args += ["--trainer.logger", "false", "--trainer.callbacks+=callbacks.RecordData"]
    run = tmp_path / "runs/smoke/version_0"
    assert train_here(tmp_path, None, *args, "--test_after_fit", "false",
                      "--trainer.callbacks+=callbacks.StopAfterEpoch", "--trainer.callbacks.epoch", "0") == 0, \
        caplog.text[-3000:]
    trained, _, held = (set(paths) for paths in json.loads((run / "data.0").read_text()))
    assert len(held) == 8 and len(trained) == 24
    added, removed = change_folder(root, trained, held)
    caplog.clear()
    assert train_here(tmp_path, None, *args, "--ckpt_path", "last") == 0, caplog.text[-3000:]
    assert load(run / "checkpoints/last.ckpt")["epoch"] == 1
    trained_now, _, held_now = (set(paths) for paths in json.loads((run / "data.0").read_text()))
    assert not trained & held_now  # validated, and tested, on no image it trained on
    assert held - removed <= held_now and held_now - held <= added and trained - removed <= trained_now
    assert trained_now | held_now == (trained | held | added) - removed
    assert int(re.search(TEST_LINE, caplog.text).group(1)) == len(held_now)


def test_an_earlier_versions_checkpoint_keeps_the_split_it_drew(folders, caplog):
    """A checkpoint without a kept split (an earlier version's: its data state holds the position only) is
    resumed with the split that version drew at every start, said in one line."""
    import logging

    from vit.data.datamodules import stratified_split

    caplog.set_level(logging.INFO)
    dm = ImageFolderDataModule(root=str(folders), image_size=16, num_workers=0, val_size=4, seed=3)
    dm.setup("fit")
    dm.load_state_dict({"train_epochs": 1, "epoch": 0, "images": 0, "skipped_images": 0})
    samples = dm.train_set.dataset.samples
    _, then = stratified_split(torch.tensor([t for _, t in samples]), 4, seed=3)
    assert split_of(dm)[1] == {samples[i][0] for i in then.tolist()}
    assert sum("records no validation split" in r.getMessage()
               for r in caplog.records) == 1
    again = ImageFolderDataModule(root=str(folders), image_size=16, num_workers=0, val_size=4, seed=3)
    again.setup("fit")
    again.load_state_dict(dm.state_dict())  # its later checkpoints go on with that split
    assert split_of(again) == split_of(dm)
    fresh = ImageFolderDataModule(root=str(folders), image_size=16, num_workers=0, val_size=4, seed=3)
    fresh.setup("fit")
    assert split_of(fresh) != split_of(dm)  # (a new run's split is another: the test above tells them apart)


def test_a_mid_epoch_resume_over_changed_training_images_says_so(tmp_path, caplog):
    """The checkpoint's place in its epoch is counted in the epoch's order over the training images it had: resumed
    over another number of them, the rest of the epoch is drawn over the images there now, and one line says so
    (resumed over the same ones, nothing is said)."""
    import logging

    root = tmp_path / "photos"
    for name, colour in (("red", (200, 20, 20)), ("blue", (20, 20, 200))):
        write_images(root / "train" / name, 12, colour, size=16)

    def resumed_loader(state):
        dm = ImageFolderDataModule(root=str(root), image_size=16, num_workers=0, val_size=4, batch_size=4)
        dm.setup("fit")
        dm.load_state_dict(state)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            dm.train_dataloader()
        return len(dm.train_set), [r.getMessage() for r in caplog.records if "training images changed" in r.getMessage()]

    first = ImageFolderDataModule(root=str(root), image_size=16, num_workers=0, val_size=4, batch_size=4)
    first.setup("fit")
    state = {**first.state_dict(), "epoch": 0, "images": 8, "skipped_images": 0, "batch_images": 4,
             "step_images": 4, "epoch_end": False}
    assert state["train_images"] == 20
    assert resumed_loader(state) == (20, [])
    write_images(root / "train" / "red" / "more", 6, (210, 30, 30), size=16, seed=7)
    now, said = resumed_loader(state)
    assert now > 20 and said == [
        f"warning: the training images changed since the checkpoint (20 then, {now} now): the rest of epoch 0 is "
        "drawn over the images there now, from the checkpoint's place in it"]


def test_testing_on_a_test_folder_does_not_refuse_another_split(tmp_path):
    """`train.py test` of a checkpoint on a folder with test/: the split, which changes nothing tested, is not
    held against the command line (resuming with it is: test_a_split_a_resume_cannot_keep_is_refused_in_one_line)."""
    from types import SimpleNamespace

    from vit.exits import ConfigError
    from vit.models.checkpoints import check_split

    root = tmp_path / "photos"
    for split, n in (("train", 10), ("test", 3)):
        for name, colour in (("red", (200, 20, 20)), ("blue", (20, 20, 200))):
            write_images(root / split / name, n, colour, size=16)
    first = ImageFolderDataModule(root=str(root), image_size=16, num_workers=0, val_size=4)
    first.setup("fit")
    ckpt = {"ImageFolderDataModule": first.state_dict()}
    data = {"class_path": "vit.data.ImageFolderDataModule", "root": str(root), "val_size": 6, "seed": 0}
    with pytest.raises(ConfigError, match="^c.ckpt: the run held out 4 of 20 images for validation with"):
        check_split(ckpt, data, "c.ckpt")
    check_split(ckpt, data, "c.ckpt", testing=True)
    dm = ImageFolderDataModule(root=str(root), image_size=16, num_workers=0, val_size=6)
    dm.trainer = SimpleNamespace(state=SimpleNamespace(fn="test"), ckpt_path="c.ckpt", default_root_dir=str(tmp_path),
                                 world_size=1, global_rank=0, is_global_zero=True)
    dm.setup("test")
    dm.load_state_dict(ckpt["ImageFolderDataModule"])
    assert len(dm.test_set) == 6


def test_a_folder_resume_keeps_the_checkpoints_split_in_any_words_and_refuses_another_before_indexing(tmp_path,
                                                                                                      capsys):
    """vit-train: the run held out 8 of its 32 images (--data.val_size 0.25); resumed with the count 8 it trains on;
    with 6, it is refused in one line (exit 2) before any work: the folder is not indexed again (its index
    removed), W&B (offline here) starts no run in the run folder."""
    from helpers import errors_of, train_here
    from vit.data import folder_index

    root, args = red_and_blue(tmp_path)
    args += ["--test_after_fit", "false"]
    run = tmp_path / "runs/smoke/version_0"
    last = run / "checkpoints/last.ckpt"
    assert train_here(tmp_path, None, *args, "--trainer.logger", "false",
                      "--trainer.callbacks+=callbacks.StopAfterEpoch", "--trainer.callbacks.epoch", "0") == 0
    before = load(last)
    assert before["ImageFolderDataModule"]["held_out"]["images"] == 32
    (run / folder_index.NAME).unlink()
    capsys.readouterr()
    assert train_here(tmp_path, None, *args, "--data.val_size", "6", "--ckpt_path", "last", wandb="offline") == 2
    assert errors_of(capsys) == [
        f"error: {last.relative_to(tmp_path)}: the run held out 8 of 32 images for validation with --data.val_size "
        f"0.25 --data.seed 0, and this command has --data.val_size 6 --data.seed 0, which would hold out others, some "
        f"of them trained on: resume with --data.val_size 0.25 (or 8) --data.seed 0, or start a new run"]
    assert not (run / folder_index.NAME).exists() and not (run / "wandb").exists()
    assert train_here(tmp_path, None, *args, "--trainer.logger", "false", "--data.val_size", "8",
                      "--ckpt_path", "last") == 0
    after = load(last)
    assert after["epoch"] == 1 and after["global_step"] == 2 * before["global_step"] > 0
    assert after["ImageFolderDataModule"]["held_out"] == before["ImageFolderDataModule"]["held_out"]
