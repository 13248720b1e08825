"""Checkpoints written before the model's options were grouped still work: tests/data/flat-options.ckpt was
written by that code (flat --model.lr, --model.optimizer muon, --model.ema_decay, --model.resize_stages, ...:
its arguments are in flat-options.json, with the probabilities and the rollout that code gave for
flat-options.png). Classify, rollout, export and the demo give the same; a test reads its options into
their groups (a resume is refused: it kept its place in the data in loader batches); an option that left and changed what a test or a resumed run does is refused in one line."""

import json
import sys

import pytest
import torch

from helpers import QUIET, TESTS, errors_of, load, make_fake_cifar, run_here, train_here

OLD = TESTS / "data" / "flat-options.ckpt"
IMAGE = TESTS / "data" / "flat-options.png"
BEFORE = json.loads((TESTS / "data" / "flat-options.json").read_text())
# the run's model, with today's names (the fixture's data: make_fake_cifar(root, 20, 40, 0))
ARCH = ["--model.arch.dim", "16", "--model.arch.depth", "1", "--model.arch.heads", "2", "--model.arch.patch_size", "8",
        "--model.arch.mlp_ratio", "2"]


def data_args(root) -> list[str]:
    return ["--data.root", str(make_fake_cifar(root, 20, 40, 0)), "--data.val_size", "20", "--data.num_workers", "0",
            "--data.batch_size", "20", "--trainer.logger", "false", *QUIET]


def probabilities(predictions: list[dict], names: list[str]) -> list[float]:
    by_label = {p["label"]: p["probability"] for p in predictions}
    return [by_label[name] for name in names]


def test_upgrade_moves_the_flat_options_into_their_groups_and_drops_those_that_left():
    from vit.models.checkpoints import read_checkpoint
    from vit.training.module import ViTClassifier

    assert load(OLD)["hyper_parameters"]["optimizer"] == "muon"  # (the fixture is flat)
    hparams = read_checkpoint(OLD)["hyper_parameters"]
    assert hparams["optimizer"] == {"name": "muon", "lr": 0.01, "lr_batch_size": 128, "weight_decay": 0.05,
                                    "betas": [0.9, 0.999], "muon_lr": None}
    assert hparams["schedule"] == {"warmup_epochs": 0.5, "min_lr": 1e-4, "resize_stages": [[16, 0.5]]}
    assert hparams["augmentation"] == {"label_smoothing": 0.1, "mixup": 0.0, "cutmix": 0.0, "mix_prob": 1.0,
                                       "random_erasing": 0.0}
    assert hparams["ema_decay"] == 0.5 and hparams["arch"]["dim"] == 16
    assert not {"lr", "pos_init", "decay", "tta_flip", "mimetic", "muon_ns_dtype", "_removed"} & set(hparams)
    module = ViTClassifier(**{k: v for k, v in hparams.items() if not k.startswith("_")})
    assert module.optimizer_config.name == "muon" and module.schedule_config.resize_stages == ((16, 0.5),)
    assert module.augmentation_config.label_smoothing == 0.1 and module.ema is not None


def test_classify_rollout_export_and_the_demo_give_what_they_gave(tmp_path):
    from vit.inference.demo import analyse
    from vit.data.images import load_image
    from vit.inference.classifier import load_classifier
    from vit.models.rollout import explain

    clf = load_classifier(OLD)
    names = clf.class_names
    proc = run_here("classify.py", "--checkpoint", OLD, IMAGE, "--json", "--top-k", "10")
    assert proc.returncode == 0, proc.stderr
    classified = probabilities(json.loads(proc.stdout)[0]["predictions"], names)
    assert classified == pytest.approx(BEFORE["probabilities"], abs=1e-4)  # (classify rounds to 4 places)
    assert max(BEFORE["probabilities"]) - min(BEFORE["probabilities"]) > 1e-3  # (they tell classes apart)

    proc = run_here("rollout.py", "--checkpoint", OLD, IMAGE, "--output-dir", tmp_path / "rollout")
    assert proc.returncode == 0, proc.stderr
    assert [p.suffix for p in (tmp_path / "rollout").iterdir()] == [".png"]
    small = clf.preprocess(load_image(IMAGE))[None]
    _, rollout = explain(clf.model, clf.normalize(small), "rollout")
    torch.testing.assert_close(rollout[0], torch.tensor(BEFORE["rollout"]), rtol=0, atol=1e-5)

    proc = run_here("export.py", "--checkpoint", OLD, "--output", tmp_path / "timm")
    assert proc.returncode == 0, proc.stderr
    exported = load_classifier(f"local-dir:{tmp_path / 'timm'}")
    assert exported.probabilities(small)[0].tolist() == pytest.approx(BEFORE["probabilities"], abs=1e-5)
    card = (tmp_path / "timm" / "README.md").read_text()
    assert "optimizer.name muon" in card and "schedule.resize_stages [[16, 0.5]]" in card and "ema_decay 0.5" in card

    shown = analyse(clf, IMAGE, top_k=10)
    assert shown.error is None
    assert probabilities([{"label": c, "probability": p} for c, p in shown.top], names) == \
        pytest.approx(BEFORE["probabilities"], abs=1e-4)


def test_it_tests_with_its_options_in_their_groups(tmp_path, caplog):
    """(A resume of it is refused: it kept its place in the data in loader batches, tests/test_resume_position.py.)"""
    import re

    from helpers import TEST_LINE

    assert train_here(tmp_path, None, "test", "--ckpt_path", str(OLD), *data_args(tmp_path)) == 0
    assert re.search(TEST_LINE, caplog.text), caplog.text[-2000:]


def test_an_option_that_left_and_changed_training_or_evaluation_is_refused_there_only(tmp_path, capsys):
    """tta_flip evaluated on mirror images too, decay "linear" decayed the lr linearly: a test or a resume would
    silently do otherwise, so they say so; the inference commands never read either and load it as before."""
    from vit.inference.classifier import load_classifier

    old = load(OLD)
    old["hyper_parameters"].update(tta_flip=True, decay="linear", pos_init="sincos")
    crafted = tmp_path / "flip.ckpt"
    torch.save(old, crafted)
    assert train_here(tmp_path, None, "test", "--ckpt_path", str(crafted), *data_args(tmp_path)) == 2
    (error,) = errors_of(capsys)
    assert error.startswith(f"error: {crafted}: written with --model.tta_flip true, which this version no longer "
                            "has: validation and test would no longer average") and "decay" not in error
    assert train_here(tmp_path, None, "--ckpt_path", str(crafted), *data_args(tmp_path), *ARCH) == 2
    (error,) = errors_of(capsys)
    assert "--model.decay linear" in error and "--model.tta_flip true" in error and "pos_init" not in error
    assert "resume it with the version that wrote it" in error
    proc = run_here("classify.py", "--checkpoint", crafted, IMAGE, "--json", "--top-k", "10")
    assert proc.returncode == 0, proc.stderr
    names = load_classifier(crafted).class_names
    assert probabilities(json.loads(proc.stdout)[0]["predictions"], names) == pytest.approx(BEFORE["probabilities"],
                                                                                          abs=1e-4)


def test_crafted_model_options_are_one_line_wherever_a_checkpoint_is_read(tmp_path, capsys):
    """The model's options as Lightning saves them are named, plain values: a tensor or a key that is not text is
    refused where the file is read; flat options beside a crafted group or removed entry upgrade without a
    traceback, and what is left is refused in one line by the test and the resume alike."""
    from vit.exits import CheckpointError
    from vit.models.checkpoints import read_checkpoint, upgrade

    old = load(OLD)
    deep = []
    for _ in range(5000):
        deep = [deep]
    for crafted in ({**old["hyper_parameters"], "arch": {"dim": torch.tensor([64, 1])}}, {1: 2}, [1], None,
                    {**old["hyper_parameters"], "deep": deep}):
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(20000)  # (pickle writes the deep list recursively; torch's reader reads it whole)
        try:
            torch.save({**old, "hyper_parameters": crafted}, tmp_path / "crafted.ckpt")
        finally:
            sys.setrecursionlimit(limit)
        with pytest.raises(CheckpointError, match="not as this program writes it \\(hyper_parameters: not the model's"):
            read_checkpoint(tmp_path / "crafted.ckpt")
    assert upgrade({"schedule": 3, "warmup_epochs": 1}) == {"schedule": {"warmup_epochs": 1}}
    assert upgrade({"_removed": 5, "decay": "linear"}) == {"_removed": {"decay": "linear"}}
    assert upgrade({"schedule": {"min_lr": 0.1}, "warmup_epochs": 1}) == {"schedule": {"warmup_epochs": 1, "min_lr": 0.1}}
    torch.save({**old, "hyper_parameters": {**old["hyper_parameters"], "_removed": {"pos_init": "x"}}},
               tmp_path / "removed.ckpt")
    assert train_here(tmp_path, None, "test", "--ckpt_path", str(tmp_path / "removed.ckpt"), *data_args(tmp_path)) == 2
    (error,) = errors_of(capsys)
    assert error == f"error: {tmp_path / 'removed.ckpt'}: not as this program writes it (hyper_parameters._removed " \
                    "{'pos_init': 'x'}): test another checkpoint"
    torch.save({**old, "hyper_parameters": {**old["hyper_parameters"], "arch": {"dim": "x"}}}, tmp_path / "dim.ckpt")
    assert train_here(tmp_path, None, "test", "--ckpt_path", str(tmp_path / "dim.ckpt"), *data_args(tmp_path)) == 2
    (error,) = errors_of(capsys)
    assert error.startswith(f"error: {tmp_path / 'dim.ckpt'}: its model's options are not this version's (")
    arch = {**old["hyper_parameters"]["arch"], "dim": 32}  # (a model its weights do not fit)
    torch.save({**old, "hyper_parameters": {**old["hyper_parameters"], "arch": arch}}, tmp_path / "wide.ckpt")
    assert train_here(tmp_path, None, "test", "--ckpt_path", str(tmp_path / "wide.ckpt"), *data_args(tmp_path)) == 2
    (error,) = errors_of(capsys)
    assert error.startswith(f"error: {tmp_path / 'wide.ckpt'}: its weights and its model's options do not fit "
                            "together (Error(s) in loading state_dict")
    torch.save({**old, "vit": {**old["vit"], "class_names": ["a", "b", "c"]}}, tmp_path / "three.ckpt")
    assert train_here(tmp_path, None, "test", "--ckpt_path", str(tmp_path / "three.ckpt"), *data_args(tmp_path)) == 2
    (error,) = errors_of(capsys)
    assert error == f"error: {tmp_path / 'three.ckpt'}: its model classifies 3 classes (a, b, c), and the data of " \
                    "this command has 10: give it the data it was trained on, or start a new run"
    assert not list((tmp_path / "runs").rglob("version_*"))  # (each test claimed a run folder, removed again)
    torch.save({**old, "state_dict": {1: torch.zeros(1)}}, tmp_path / "keys.ckpt")
    with pytest.raises(CheckpointError, match="not a vit training checkpoint \\(no state_dict of named tensors\\)"):
        read_checkpoint(tmp_path / "keys.ckpt")
