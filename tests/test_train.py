"""`scripts/train.py` end to end in subprocesses, on small fake CIFAR-10 data, CPU only, W&B offline."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def train(cwd: Path, data: Path, *extra: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(TESTS), "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
    env.pop("WANDB_API_KEY", None)
    env.pop("WANDB_MODE", None)
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), "--config", str(ROOT / "configs" / "smoke.yaml"),
           "--data.root", str(data), "--data.init_args.val_size", "100", "--data.init_args.num_workers", "0",
           "--data.init_args.batch_size", "50", *extra]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def best_val_acc(ckpt: dict) -> float:
    """val/acc as computed by the run itself, from its best-checkpoint callback's state."""
    (score,) = [cb["best_model_score"].item() for cb in ckpt["callbacks"].values() if cb.get("monitor") == "val/acc"]
    return score


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, fake_cifar_session):
    cwd = tmp_path_factory.mktemp("smoke")
    proc = train(cwd, fake_cifar_session, "--data.init_args.num_workers", "2")
    return cwd, proc


def test_smoke_run_fits_checkpoints_and_tests(smoke_run):
    cwd, proc = smoke_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpts = cwd / "runs" / "smoke" / "checkpoints"
    assert (ckpts / "last.ckpt").is_file()
    (best,) = ckpts.glob("best-*.ckpt")
    match = re.search(r"test on 200 images with .*: top-1 ([\d.]+)%, top-5 ([\d.]+)%", proc.stderr + proc.stdout)
    assert match, proc.stderr[-2000:]
    assert 0 <= float(match.group(1)) <= float(match.group(2)) <= 100
    # the checkpoint alone rebuilds the model and its preprocessing
    meta = load(best)["vit"]
    assert meta["config"]["dim"] == 64 and meta["config"]["num_classes"] == 10
    assert meta["class_names"][3] == "cat"
    assert meta["mean"] == pytest.approx([0.4914, 0.4822, 0.4465]) and len(meta["std"]) == 3
    assert (cwd / "runs" / "smoke" / "config.yaml").is_file()  # the resolved config, next to the run


def test_smoke_run_logs_to_one_offline_wandb_run(smoke_run):
    cwd, proc = smoke_run
    assert "logging offline" in proc.stderr + proc.stdout
    (run_dir,) = (cwd / "runs" / "smoke" / "wandb").glob("offline-run-*")
    (records,) = run_dir.glob("run-*.wandb")  # protobuf records: the metric keys appear verbatim
    data = records.read_bytes()
    for key in ("train/loss", "val/acc", "val/acc5", "val/acc_best", "test/acc", "test/acc5", "lr-AdamW"):
        assert key.encode() in data, key
    assert list((run_dir / "files" / "media" / "table" / "val").glob("samples_*.table.json"))
    meta = load(cwd / "runs" / "smoke" / "checkpoints" / "last.ckpt")["vit"]
    assert meta["wandb_run_id"] and meta["wandb_run_id"] in run_dir.name


def test_learning_is_real(smoke_run):
    """The fake task is learnable (class = colour): the smoke recipe is far above 10% chance."""
    cwd, proc = smoke_run
    best = next((cwd / "runs" / "smoke" / "checkpoints").glob("best-*.ckpt"))
    score = best_val_acc(load(best))
    assert score >= 0.6, f"val/acc_best {score}"


@pytest.mark.parametrize("args, message", [
    (["--model.dim", "65"], "error: dim 65 is not divisible by heads 4"),
    (["--model.lr", "fast"], 'error: Parser key "model.lr": Expected a <class \'float\'>. Got value: fast'),
    (["--data.batch_size", "-3"], "error: batch_size must be positive, got -3"),
    (["--data.pipeline", "gpu"], "error: pipeline must be 'workers' or 'device', got 'gpu'"),
    (["--data.val_size", "5000"], "error: val_size must be in [0, 500), got 5000"),
    (["--ckpt_path", "nowhere.ckpt"], "error: --ckpt_path nowhere.ckpt: no such checkpoint file"),
])
def test_bad_config_value_is_one_clear_message(tmp_path, fake_cifar_session, args, message):
    proc = train(tmp_path, fake_cifar_session, *args)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [message], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_missing_dataset_offline_is_one_clear_message(tmp_path):
    proc = train(tmp_path, tmp_path / "empty", "--data.init_args.download", "false")
    assert proc.returncode == 2
    assert "cifar-10-batches-py" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("pipeline", ["workers", "device"])
def test_resume_matches_an_uninterrupted_run(tmp_path, fake_cifar_session, pipeline):
    args = ["--trainer.max_epochs", "2", "--trainer.logger", "false", "--test_after_fit", "false",
            "--data.init_args.num_workers", "1", "--data.init_args.pipeline", pipeline]
    full, part = tmp_path / "full", tmp_path / "part"
    full.mkdir(), part.mkdir()
    assert train(full, fake_cifar_session, *args).returncode == 0
    first = train(part, fake_cifar_session, *args, "--trainer.callbacks+=callbacks.StopAfterEpoch",
                  "--trainer.callbacks.epoch", "0")
    assert first.returncode == 0, first.stderr[-2000:]
    assert load(part / "runs/smoke/checkpoints/last.ckpt")["epoch"] == 0
    resumed = train(part, fake_cifar_session, *args, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = load(full / "runs/smoke/checkpoints/last.ckpt"), load(part / "runs/smoke/checkpoints/last.ckpt")
    assert a["global_step"] == b["global_step"] == 16
    for key, value in a["state_dict"].items():
        torch.testing.assert_close(b["state_dict"][key], value, rtol=0, atol=0, msg=key)


def test_ddp_two_processes_on_cpu(tmp_path, fake_cifar_session):
    proc = train(tmp_path, fake_cifar_session, "--trainer.devices", "2", "--trainer.strategy", "ddp",
                 "--trainer.max_epochs", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpts = tmp_path / "runs" / "smoke" / "checkpoints"
    (best,) = ckpts.glob("best-*.ckpt")
    assert sorted(p.name for p in ckpts.iterdir()) == sorted([best.name, "last.ckpt"])
    assert len(list((tmp_path / "runs" / "smoke" / "wandb").glob("offline-run-*"))) == 1
    assert len(re.findall(r"test on 200 images", proc.stderr + proc.stdout)) == 1
    ckpt = load(best)
    ddp_acc = best_val_acc(ckpt)

    # the same weights, validated by a single process
    from vit.data import CIFAR10DataModule
    from vit.training import ViTClassifier

    model = ViTClassifier(**{k: v for k, v in ckpt["hyper_parameters"].items() if not k.startswith("_")})
    model.load_state_dict(ckpt["state_dict"])
    dm = CIFAR10DataModule(root=str(fake_cifar_session), val_size=100, num_workers=0, batch_size=50)
    dm.setup("fit")
    model.eval()
    with torch.no_grad():
        correct = sum((model(x).argmax(-1) == y).sum().item() for x, y in dm.val_dataloader())
    assert correct / len(dm.val_set) == pytest.approx(ddp_acc, abs=1e-6)


def test_resumed_run_continues_the_same_wandb_run(tmp_path, fake_cifar_session):
    args = ["--trainer.max_epochs", "2", "--test_after_fit", "false"]
    first = train(tmp_path, fake_cifar_session, *args, "--trainer.callbacks+=callbacks.StopAfterEpoch",
                  "--trainer.callbacks.epoch", "0")
    assert first.returncode == 0, first.stderr[-2000:]
    run_id = load(tmp_path / "runs/smoke/checkpoints/last.ckpt")["vit"]["wandb_run_id"]
    resumed = train(tmp_path, fake_cifar_session, *args, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    ckpt = load(tmp_path / "runs/smoke/checkpoints/last.ckpt")
    assert ckpt["epoch"] == 1 and ckpt["vit"]["wandb_run_id"] == run_id
    runs = sorted((tmp_path / "runs" / "smoke" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.name.endswith(run_id) for r in runs)
