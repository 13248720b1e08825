"""`scripts/train.py` on small generated data, CPU only: README's commands end to end in subprocesses (W&B
offline), the other options through vit-train's main() in this process (`train_here`), which skips the 5-7 s
of a subprocess's start-up and exit."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import (QUIET, ROOT, TEST_LINE, best_val_acc, digest, errors_of, fake_wandb, load, sync_here, train,
                     train_here, wandb_records, wandb_summary_keys, write_bad_files, write_images)



@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, fake_cifar_session):
    cwd = tmp_path_factory.mktemp("smoke")
    proc = train(cwd, fake_cifar_session, "--data.num_workers", "2")
    return cwd, proc


def test_smoke_run_writes_one_run_folder_and_tests(smoke_run):
    cwd, proc = smoke_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = cwd / "runs" / "smoke" / "version_0"
    assert sorted(p.name for p in cwd.iterdir()) == ["runs"] and [p.name for p in run.parent.iterdir()] == ["version_0"]
    assert {"checkpoints", "config.yaml", "metrics.csv", "wandb"} <= {p.name for p in run.iterdir()}
    assert (run / "checkpoints" / "last.ckpt").is_file()
    (best,) = (run / "checkpoints").glob("best-*.ckpt")
    match = re.search(TEST_LINE, proc.stderr + proc.stdout)
    assert match and match.group(1) == "200" and match.group(2) == str(best), proc.stderr[-2000:]
    assert 0 <= float(match.group(3)) <= float(match.group(4)) <= 100
    meta = load(best)["vit"]  # the checkpoint alone rebuilds the model and its preprocessing
    assert meta["config"]["dim"] == 64 and meta["config"]["num_classes"] == 10
    assert meta["class_names"][3] == "cat"
    assert meta["mean"] == pytest.approx([0.4914, 0.4822, 0.4465]) and len(meta["std"]) == 3
    assert "run folder: runs/smoke/version_0" in proc.stderr


def test_smoke_run_writes_its_record(smoke_run):
    """results.json: the printed test line's figures, the run's progress, and what made it."""
    import json

    cwd, proc = smoke_run
    run = cwd / "runs" / "smoke" / "version_0"
    record = json.loads((run / "results.json").read_text())
    images, tested, top1, top5 = re.search(TEST_LINE, proc.stderr).groups()
    assert (record["test_top1"], record["test_top5"]) == (float(top1), float(top5))
    assert record["test_images"] == int(images) > 0
    assert run / record["checkpoint"] == Path(tested)
    assert record["best_val_acc"] == pytest.approx(100 * best_val_acc(load(Path(tested))), abs=0.01)
    assert record["recipe"] == "smoke" and record["command"].startswith("python scripts/train.py --config smoke")
    assert "--data.num_workers 2" in record["command"]
    assert record["commit"] is None or len(record["commit"]) == 40
    assert record["device_count"] == 1 and record["device"] == record["cpu"] and record["torch_threads"] >= 1
    assert set(record["versions"]) >= {"torch", "lightning", "timm"}
    assert record["epochs"] == 3 and record["steps"] == 3 * 400 // 50
    assert 0 < record["training_seconds"] < record["wall_seconds"]
    assert record["train_images_per_second"] == pytest.approx(record["steps"] * 50 / record["training_seconds"], rel=0.01)
    assert record["date"].startswith("20")
    assert f"record: {run.relative_to(cwd)}/results.json" in proc.stderr


def test_output_has_no_third_party_noise(smoke_run):
    _, proc = smoke_run
    out = proc.stderr + proc.stdout
    for noise in ("litlogger", "Warning", "warn(", "anonymous", "exists and is not empty", "Restoring states"):
        assert noise not in out, noise
    assert out.count("GPU available") == 1  # not again for the test


def test_smoke_run_logs_to_one_offline_wandb_run(smoke_run):
    cwd, proc = smoke_run
    run = cwd / "runs" / "smoke" / "version_0"
    assert "logging offline" in proc.stderr + proc.stdout
    (wandb_dir,) = (run / "wandb").glob("offline-run-*")
    (records,) = wandb_dir.glob("run-*.wandb")  # protobuf records: the metric keys appear verbatim
    data = b"".join(wandb_records(records))
    for key in ("train/loss", "val/acc", "val/acc5", "val/acc_best", "test/acc", "test/acc5", "lr-AdamW"):
        assert key.encode() in data, key
    assert list((wandb_dir / "files" / "media" / "table" / "val").glob("samples_*.table.json"))
    meta = load(run / "checkpoints" / "last.ckpt")["vit"]
    assert meta["wandb_run_id"] and meta["wandb_run_id"] in wandb_dir.name
    assert f"model-{meta['wandb_run_id']}".encode() in data  # best and last checkpoints as artifacts (log_model)
    for key in (b"ModelCheckpoint", b"seed_everything", b"pipeline"):  # the whole config: callbacks, data, ...
        assert key in data, key
    for key in ("report/learning_curves", "report/confusion_matrix", "report/test_examples"):
        assert key.encode() in data, key
    # the record, in the summary
    assert {"test_top1", "best_val_acc", "train_images_per_second", "commit"} <= wandb_summary_keys(records)
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"epoch", "step", "val/acc", "train/loss", "test/acc"} <= set(header)
    assert "class_path: vit.training.callbacks.Throughput" in (run / "config.yaml").read_text()  # ThroughputMonitor is on


@pytest.mark.long
@pytest.mark.lowest  # (wandb's lower bound: pyproject.toml)
def test_the_keys_training_md_names_are_the_ones_w_and_b_gets(smoke_run, tmp_path, monkeypatch):
    """The smoke run's offline W&B run, uploaded by vit-sync to a stand-in server: every key it plots is in
    docs/training.md's table of metrics, as is every key of metrics.csv; every key the table names is
    logged, but those of what a smoke run has not (Muon, TimeToAccuracy, 100 steps for the rolling rates,
    several processes)."""
    cwd, proc = smoke_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (ROOT / "docs/training.md").read_text()
    table = page[page.index("### Metrics"):].split("\n\n")[2]
    documented = {key for line in table.splitlines()[2:] for key in re.findall(r"`([\w-]+/[\w./]+)`", line.split("|")[2])}
    with fake_wandb() as server:
        for name, value in {"WANDB_BASE_URL": f"http://127.0.0.1:{server.server_port}", "HOME": str(tmp_path),
                            "NETRC": str(tmp_path / "netrc"), "WANDB_CONFIG_DIR": str(tmp_path / "wandb"),
                            "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567", "no_proxy": "127.0.0.1",
                            "NO_PROXY": "127.0.0.1", "WANDB_SILENT": "true"}.items():
            monkeypatch.setenv(name, value)
        synced = sync_here(cwd / "runs")
        assert synced.returncode == 0, synced.stdout + synced.stderr
        (rows,) = server.runs.values()
    logged = {key for row in rows for key in row if not key.startswith("_")}
    bookkeeping = {"epoch", "trainer/global_step", "train/batches", "train/samples", "train/time"}
    media = {key for key in logged if key.startswith(("report/", "val/samples", "val/rollout"))}
    assert logged - bookkeeping - media <= documented, logged - documented
    header = set((cwd / "runs/smoke/version_0/metrics.csv").read_text().splitlines()[0].split(","))
    assert header - {"step"} <= logged and header - {"step"} - bookkeeping <= documented
    not_here = {key for key in documented if "Muon" in key or key.startswith("time_to/") or key.endswith(
        ("samples_per_sec", "flops_per_sec", "mfu"))}
    assert documented - not_here <= logged, documented - not_here - logged
    assert {"train/loss_step", "val/acc", "test/acc", "lr-AdamW/pg1"} <= logged and len(not_here) == 8

def test_learning_is_real(smoke_run):
    """The generated task is learnable (class = colour): the smoke recipe is far above 10% chance. Over
    seeds 0-5 (AMD EPYC, 2026-11-23, augmentation seeded per image: vit.data.resume) its best val was 0.92,
    0.92, 0.92, 0.79, 0.85, 0.66: the worst is well above 0.4, four times chance."""
    cwd, _ = smoke_run
    best = next((cwd / "runs" / "smoke" / "version_0" / "checkpoints").glob("best-*.ckpt"))
    assert best_val_acc(load(best)) >= 0.4


def test_test_command_evaluates_a_checkpoint_like_the_end_of_fit(smoke_run, fake_cifar_session, tmp_path):
    cwd, fit = smoke_run
    (best,) = (cwd / "runs" / "smoke" / "version_0" / "checkpoints").glob("best-*.ckpt")
    proc = train(tmp_path, fake_cifar_session, "test", "--ckpt_path", str(best), "--trainer.logger", "false")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(TEST_LINE, proc.stderr).groups() == re.search(TEST_LINE, fit.stderr).groups()
    assert not list(tmp_path.iterdir())  # written into the checkpoint's own run folder, not here
    import json

    record = json.loads((best.parents[1] / f"results-{best.stem}.json").read_text())  # results.json kept
    assert record["test_top1"] == float(re.search(TEST_LINE, fit.stderr).group(3))
    assert record["command"].startswith("python scripts/train.py test --config smoke")
    assert record["steps"] == load(best)["global_step"]  # the tested checkpoint's run, up to that checkpoint


def test_test_without_a_checkpoint_is_one_clear_message(tmp_path, fake_cifar_session, capsys):
    assert train_here(tmp_path, fake_cifar_session, "test") == 2
    (error,) = errors_of(capsys)
    assert "test needs --ckpt_path" in error


@pytest.mark.parametrize("args, message", [
    (["--model.arch.dim", "65"], "error: dim 65 is not divisible by heads 4"),
    (["--model.optimizer.lr", "fast"], 'error: Parser key "model.optimizer.lr": Not of type PositiveFloat: could not convert string '
                             "to float: 'fast'"),
    (["--model.optimizer.lr", "-1"], 'error: Parser key "model.optimizer.lr": Not of type PositiveFloat: -1 does not conform to '
                           'restriction v>0'),
    (["--model.augmentation.label_smoothing", "2"], 'error: Parser key "model.augmentation.label_smoothing": Not of type ClosedUnitInterval: '
                                       '2 does not conform to restriction v>=0 and v<=1'),
    (["--data.batch_size", "-3"], 'error: Parser key "data.batch_size": Not of type PositiveInt: -3 does not '
                                  'conform to restriction v>0'),
    (["--data.pipeline", "gpu"], 'error: Parser key "data.pipeline": Expected a typing.Literal[\'workers\', '
                                 "'device']. Got value: gpu"),
    (["--data.val_size", "5000"], "error: val_size must leave images on both sides: between 1 and 499 of 500 "
                                  "images, got 5000"),
    (["--data.batch_size", "1000"], "error: the training set has 400 images, fewer than one batch of 1000: "
                                    "lower --data.batch_size"),
    (["--ckpt_path", "nowhere.ckpt"], "error: nowhere.ckpt: no such checkpoint file"),
    (["--model.schedule.resize_stages", "[[18, 0.5]]"], "error: resize_stages: a stage's image size must be a multiple of "
                                               "the patch size 4 below the image size 32, got 18"),
    (["--model.optimizer", "muon"], "error: --model.optimizer muon is --model.optimizer.name muon now (the model's "
                                    "options are grouped: optimizer, schedule, augmentation; see --help)"),
    (["--model.lr=1e-3", "--model.tta_flip", "true"], "error: --model.lr 1e-3 is --model.optimizer.lr 1e-3 now; "
     "--model.tta_flip is no longer an option: averaging each image with its mirror image doubled validation's "
     "cost, and measured with sin-cos E_pos and linear decay it lost 1.2 points (docs/results.md); vit-classify "
     "--tta-flip still does it (the model's options are grouped: optimizer, schedule, augmentation; see --help)"),
    (["--config", "nosuch"], "error: --config nosuch: neither a file nor a recipe name (cpu, finetune_cifar10, smoke, "
                             "vit_cifar10, vit_cifar10_fast, vit_cifar10_lee, vit_tiny_cifar10)"),
])
def test_bad_config_value_is_one_clear_message(tmp_path, fake_cifar_session, args, message, capsys, monkeypatch):
    """vit-train's main() in this process (the subprocess start-up, 12 times, is what these would cost)."""
    from vit.commands.train import main

    monkeypatch.chdir(tmp_path)
    code = main(["--config", "smoke", "--data.root", str(fake_cifar_session), "--data.val_size", "100",
                 "--data.num_workers", "0", "--data.batch_size", "50", *QUIET, "--trainer.logger", "false", *args])
    stderr = capsys.readouterr().err
    assert code == 2
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert errors == [message], stderr[-2000:]
    assert "Traceback" not in stderr


def test_missing_dataset_offline_is_one_clear_message(tmp_path, capsys):
    assert train_here(tmp_path, None, "--data.root", str(tmp_path / "empty"), "--data.download", "false") == 2
    err = capsys.readouterr().err
    (error,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert "cifar-10-batches-py" in error and "Traceback" not in err
    assert not (tmp_path / "runs" / "smoke" / "version_0").exists()  # no empty run folder left behind


@pytest.mark.long
def test_two_runs_side_by_side_never_collide(tmp_path, fake_cifar_session, caplog):
    args = ["--trainer.max_epochs", "1", "--trainer.logger", "false", "--test_after_fit", "false"]
    procs = [subprocess.Popen([sys.executable, str(ROOT / "scripts" / "train.py"), "--config", "smoke",
                               "--data.root", str(fake_cifar_session), "--data.val_size", "100",
                               "--data.num_workers", "0", "--data.batch_size", "50", "--seed_everything", str(seed),
                               *QUIET, *args], cwd=tmp_path, stderr=subprocess.PIPE, text=True)
             for seed in (1, 2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0], [p.stderr.read()[-1500:] for p in procs]
    runs = sorted((tmp_path / "runs" / "smoke").iterdir())
    assert [r.name for r in runs] == ["version_0", "version_1"]
    heads = [load(r / "checkpoints" / "last.ckpt")["state_dict"]["model.head.weight"] for r in runs]
    assert not torch.equal(*heads)  # each folder holds its own run
    assert all(len(list((r / "checkpoints").glob("best-*.ckpt"))) == 1 for r in runs)
    # the run named by --run is resumed, not the newest
    assert train_here(tmp_path, fake_cifar_session, *args[:-2], "--trainer.max_epochs", "2", "--ckpt_path", "last",
                      "--run", "version_0", "--test_after_fit", "false") == 0
    assert "resuming runs/smoke/version_0 from its last.ckpt" in caplog.text
    assert load(runs[0] / "checkpoints" / "last.ckpt")["epoch"] == 1
    assert load(runs[1] / "checkpoints" / "last.ckpt")["epoch"] == 0


@pytest.mark.long
def test_nothing_is_written_to_the_working_directory(tmp_path, fake_cifar_session):
    elsewhere, cwd = tmp_path / "elsewhere", tmp_path / "cwd"
    cwd.mkdir()
    proc = train(cwd, fake_cifar_session, "--trainer.max_epochs", "1", "--trainer.default_root_dir", str(elsewhere))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list(cwd.iterdir()) == []
    run = elsewhere / "version_0"
    assert {"checkpoints", "config.yaml", "metrics.csv", "wandb"} <= {p.name for p in run.iterdir()}


SMALLER = ["--model.arch.dim", "32", "--model.arch.depth", "1", "--model.arch.heads", "2"]  # the smoke recipe, smaller


def test_a_diverged_run_stops_with_exit_3_and_keeps_its_good_checkpoints(tmp_path, fake_cifar_session, capsys,
                                                                         caplog):
    args = ["--trainer.max_epochs", "3", "--trainer.logger", "false", *SMALLER]
    assert train_here(tmp_path, fake_cifar_session, *args, "--trainer.callbacks+=callbacks.StopAfterEpoch",
                      "--trainer.callbacks.epoch", "0") == 0
    checkpoints = tmp_path / "runs/smoke/version_0/checkpoints"
    before = digest(checkpoints)
    caplog.clear()
    capsys.readouterr()
    assert train_here(tmp_path, fake_cifar_session, *args, "--ckpt_path", "last",
                      "--trainer.callbacks+=callbacks.PoisonAtEpoch", "--trainer.callbacks.epoch", "1") == 3
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.match(r"error: training diverged at step 8 \(epoch 1\): .* \(last finite loss "
                                         r"\d+\.\d{4}\)\. Try a lower --model.optimizer.lr", errors[0]), err[-2000:]
    assert "test on" not in err + caplog.text and "Traceback" not in err
    assert digest(checkpoints) == before  # the last good last.ckpt and best checkpoint, untouched


def test_a_huge_learning_rate_diverges_without_a_checkpoint(tmp_path, fake_cifar_session, capsys):
    assert train_here(tmp_path, fake_cifar_session, "--model.optimizer.lr", "1e5", "--trainer.logger", "false") == 3
    (error,) = errors_of(capsys)
    assert "training diverged at step" in error
    assert not list(tmp_path.rglob("*.ckpt"))


def test_unusable_checkpoints_to_resume_exit_2_and_overwrite_nothing(tmp_path, fake_cifar_session, trained_checkpoint,
                                                                    capsys):
    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    (tmp_path / "corrupt.ckpt").write_bytes(trained_checkpoint.read_bytes()[:5000])
    torch.save({"state_dict": {}, "payload": Exploit()}, tmp_path / "evil.ckpt")
    torch.save({**load(trained_checkpoint), "hyper_parameters": [1]}, tmp_path / "crafted.ckpt")
    (tmp_path / "copy.ckpt").write_bytes(trained_checkpoint.read_bytes())  # (outside a run folder: a new one's)
    weights = load(trained_checkpoint)
    weights["state_dict"]["model.patch_embedding.proj.weight"] = torch.zeros(3, 3)  # (options and weights apart)
    torch.save(weights, tmp_path / "weights.ckpt")
    cases = [(["--ckpt_path", str(tmp_path / "corrupt.ckpt")], "not a readable checkpoint"),
             (["--ckpt_path", str(tmp_path / "evil.ckpt")], "refused, the checkpoint references code"),
             (["--ckpt_path", str(tmp_path / "crafted.ckpt")],
              "not as this program writes it (hyper_parameters: not the model's options"),
             (["--ckpt_path", str(tmp_path / "copy.ckpt"), "--model.arch.dim", "96"], "its model does not fit"),
             (["--ckpt_path", str(tmp_path / "weights.ckpt")],  # (Lightning's load: a traceback)
              "its weights and its model's options do not fit together (Error(s) in loading state_dict for "
              "ViTClassifier: size mismatch for model.patch_embedding.proj.weight"),
             (["--ckpt_path", str(trained_checkpoint), "--model.ema_decay", "0.9"],  # (Lightning's load: a traceback)
              "its model does not fit this command line (EMA weights (--model.ema_decay): checkpoint False, command "
              "line True)"),
             (["--ckpt_path", str(trained_checkpoint), "--model.arch.dim", "96", "--model.arch.depth", "2"],
              "its model does not fit this command line (dim: checkpoint 64, command line 96; depth: checkpoint 4, "
              "command line 2)")]
    run = trained_checkpoint.parent.parent
    before = digest(run)
    for args, message in cases:
        code = train_here(tmp_path, fake_cifar_session, *args, "--trainer.logger", "false")
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(errors) == 1 and message in errors[0] and "Traceback" not in err, (args, err[-2000:])
    assert digest(run) == before and not (tmp_path / "pwned").exists()
    assert not (tmp_path / "runs").exists()


def test_own_image_folders_with_bad_and_rotated_files_train(tmp_path, capfd, caplog):
    """vit-train's main() in this process (README's command on image folders runs as a subprocess in
    tests/test_folders.py)."""
    from PIL import Image

    data = tmp_path / "photos"
    write_images(data / "train" / "red", 12, (200, 20, 20))
    write_images(data / "train" / "blue", 12, (20, 20, 200))
    exif = Image.Exif()
    exif[0x0112] = 6  # stored sideways, as phones do
    Image.new("RGB", (60, 30), (20, 20, 200)).save(data / "train" / "blue" / "phone.jpg", exif=exif)
    write_bad_files(data / "train" / "red")
    code = train_here(tmp_path, None, "--data", "vit.data.ImageFolderDataModule", "--data.root", str(data),
                      "--data.batch_size", "8", "--data.num_workers", "2", "--trainer.max_epochs", "2",
                      "--trainer.logger", "false")
    err, out = capfd.readouterr().err, caplog.text  # capfd: the loader workers' stderr too
    assert code == 0, (err + out)[-3000:]
    run = tmp_path / "runs" / "smoke" / "version_0"
    listed = (run / "bad_files.txt").read_text().splitlines()
    assert sorted(line.split("\t")[0].rsplit("/", 1)[1] for line in listed) == ["empty.png", "notes.png",
                                                                               "truncated.jpg"]
    assert re.search(r"skipping 3 of 28 images that cannot be read \(all listed in .*bad_files.txt\)", out)
    assert "has no test/ folder: the validation images are used for the test" in out
    assert re.search(r"test on (\d+) images with", out).group(1) == str(round(0.1 * 25))  # of the good ones
    assert "Traceback" not in err and "warning: skipping" not in err + out


def test_finetune_on_own_folders_as_the_docs_say(tmp_path):
    """docs/training.md's fine-tuning command (offline: a timm state dict) on generated folders, the recipe's
    ViT-S shrunk to a small one with its weights: the weights are taken, the head gets the folders' classes."""
    from safetensors.torch import save_file
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    data = tmp_path / "photos"
    for name, colour in (("red", (200, 20, 20)), ("blue", (20, 20, 200)), ("green", (20, 200, 20))):
        write_images(data / "train" / name, 8, colour)
    torch.manual_seed(0)
    timm_model = TimmViT(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=1000)
    save_file({k: v.contiguous() for k, v in timm_model.state_dict().items()}, tmp_path / "weights.safetensors")
    small = ["--model.arch.image_size", "32", "--model.arch.patch_size", "8", "--model.arch.dim", "32",
             "--model.arch.depth", "1", "--model.arch.heads", "2", "--trainer.precision", "32-true",
             "--data.batch_size", "8", "--data.num_workers", "0", "--trainer.max_epochs", "1", *QUIET]
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "--config", "finetune_cifar10",
                           "--data", "vit.data.ImageFolderDataModule", "--data.root", str(data),
                           "--model.pretrained", str(tmp_path / "weights.safetensors"),
                           "--model.mean", "[0.5,0.5,0.5]", "--model.std", "[0.5,0.5,0.5]", *small],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(TEST_LINE, proc.stderr + proc.stdout)
    (best,) = (tmp_path / "runs" / "finetune_cifar10" / "version_0" / "checkpoints").glob("best-*.ckpt")
    checkpoint = load(best)
    assert checkpoint["vit"]["class_names"] == ["blue", "green", "red"]
    assert checkpoint["state_dict"]["model.head.weight"].shape == (3, 32)
    assert checkpoint["vit"]["mean"] == checkpoint["vit"]["std"] == pytest.approx([0.5, 0.5, 0.5])
    torch.testing.assert_close(checkpoint["state_dict"]["model.cls_token"], timm_model.cls_token, rtol=0.1, atol=0.05)


def test_help_shows_the_named_recipes_defaults():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "--config", "smoke", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    assert re.search(r"--model.arch.dim DIM\s+width D of every token. \(type: int, default: 64\)", proc.stdout)
    assert "finetune_cifar10, smoke, vit_cifar10, vit_cifar10_fast, vit_cifar10_lee, vit_tiny_cifar10" in " ".join(proc.stdout.split())


@pytest.mark.long
def test_a_run_leaves_figures_drawn_from_its_logged_metrics(smoke_run, fake_cifar_session):
    from PIL import Image

    from vit.reporting import report

    cwd, _ = smoke_run
    run = cwd / "runs" / "smoke" / "version_0"
    for name in (report.CURVES, report.CONFUSION, report.EXAMPLES):
        with Image.open(run / name) as png:
            assert png.width >= 500 and png.height >= 300, name
    metrics = report.read_metrics(run / "metrics.csv")
    assert [e for e, _ in metrics["val/acc"]] == [0.0, 1.0, 2.0]  # 3 epochs of the smoke recipe
    figure = report.learning_curves(metrics)
    loss, accuracy, lr = figure.axes
    for ax, key in ((loss, "train/loss"), (loss, "val/loss"), (accuracy, "train/acc"), (accuracy, "val/acc")):
        (line,) = [ln for ln in ax.lines if ln.get_label() == key.split("/")[0]]
        assert list(line.get_ydata()) == [v for _, v in metrics[key]], key
    assert list(lr.lines[0].get_ydata()) == [v for _, v in metrics["lr-AdamW/pg1"]]
    # vit-report draws them again from the run folder alone
    for name in (report.CURVES, report.CONFUSION, report.EXAMPLES):
        (run / name).unlink()
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "report.py"), str(run), *QUIET], cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert all((run / name).is_file() for name in (report.CURVES, report.CONFUSION, report.EXAMPLES))


@pytest.mark.long
def test_time_budget_schedule_decays_over_the_budget(tmp_path, fake_cifar_session, caplog, monkeypatch):
    """max_time cuts the run wherever it is: the cosine, laid over the budget, reaches min_lr by then, and
    the resize stages end at their shares of the budget (one line at each switch). The Timer reads a clock
    that moves 1/8 s at each batch's start, so the run's steps and lrs are the same on any machine."""
    import types

    import lightning.pytorch.callbacks.timer as timer
    from timm.scheduler import CosineLRScheduler

    from vit.data.resume import StepEndTimer

    clock = types.SimpleNamespace(now=1000.0)

    def tick(self, *args) -> None:
        clock.now += 0.125
        if clock.now > 1016:  # twice the budget: the Timer did not stop the run (a failure, not an endless run)
            raise AssertionError("--trainer.max_time did not stop the run")

    # (Lightning's Timer and vit's have no hook at a batch's start: this one is the test's alone)
    assert "on_train_batch_start" not in vars(timer.Timer) and "on_train_batch_start" not in vars(StepEndTimer)
    monkeypatch.setattr(timer, "time", types.SimpleNamespace(monotonic=lambda: clock.now))
    monkeypatch.setattr(timer.Timer, "on_train_batch_start", tick, raising=False)
    assert train_here(tmp_path, fake_cifar_session, "--trainer.max_epochs", "-1", "--trainer.max_time", "00:00:00:08",
                      "--trainer.logger", "vit.training.loggers.CSVLogger", "--trainer.log_every_n_steps", "1",
                      "--test_after_fit", "false", "--model.schedule.resize_stages", "[[16, 0.3], [24, 0.6]]") == 0
    out = caplog.text
    assert "then cosine to 0.0001 at 8 s of training" in out and "Time limit reached" in out, out[-2000:]
    switches = re.findall(r"step (\d+): training on (\d+)-px images \((\d+) patch tokens\)", out)
    # the size moves after the step whose clock reaches 0.3 and 0.6 of the 8 s: 2.4 s and 4.8 s, at 1/8 s a step,
    # one step later than the clock: the schedule reads the clock that every process agreed on at the end of
    # the step before (vit.training.agreement; every step here, as log_every_n_steps is 1)
    assert [tuple(map(int, s)) for s in switches] == [(0, 16, 16), (21, 24, 36), (40, 32, 64)]
    from vit.reporting import report

    lr = [v for _, v in report.read_metrics(tmp_path / "runs/smoke/version_0/metrics.csv")["lr-AdamW/pg1"]]
    assert len(lr) == 64  # the 64 steps of 8 s, at 1/8 s each
    # each step's lr is timm's warmup (8 steps: one epoch) and then the cosine over the seconds after the warmup
    peak, warmup = 2e-3 * 50 / 128, 8
    optimizer = torch.optim.SGD([torch.zeros(1)], lr=peak)
    timm = CosineLRScheduler(optimizer, t_initial=10_000, lr_min=1e-4, warmup_t=warmup, warmup_lr_init=peak * 1e-3,
                             warmup_prefix=True, t_in_epochs=False)
    # the clock agreed at the end of the step before (as above): the first step after the warmup reads warmup × 1/8 s
    end_of_warmup = warmup * 0.125
    updates = [step if step <= warmup else
               warmup + round(((step - 1) * 0.125 - end_of_warmup) / (8 - end_of_warmup) * 10_000) for step in range(64)]
    expected = [timm.step_update(u) or optimizer.param_groups[0]["lr"] for u in updates]
    assert lr == pytest.approx(expected, rel=1e-6)
    assert lr[-1] < 1e-4 + 0.01 * (peak - 1e-4)  # the last step's lr is at the cosine's end


def test_without_a_gpu_the_default_is_the_cpu_recipe(tmp_path, fake_cifar_session):
    """`make train` on a machine without a GPU, with what a user gets (progress lines, W&B offline): the cpu
    recipe, Muon and its first resize stage included; its output, read as a log file, is plain text."""
    env = dict(os.environ)
    for key in ("VIT_ASSUME_GPU", "WANDB_MODE", "WANDB_API_KEY", "WANDB_SILENT"):
        env.pop(key, None)
    env.update(WANDB_PROJECT="cifar-vits", WANDB_ENTITY="my-team")  # docs/training.md's W&B line
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "--data.root", str(fake_cifar_session),
                           "--trainer.max_time", "00:00:00:03"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ("no GPU here: the default recipe vit_cifar10 is a GPU recipe (100 epochs, bf16), so this runs the cpu "
            "recipe (10 minutes)") in proc.stderr
    assert "On a cluster's login node, train on a GPU node instead: sbatch scripts/slurm/train.sbatch" in proc.stderr
    assert "step 0: training on 16-px images (16 patch tokens)" in proc.stderr and "logging offline" in proc.stderr
    config = (tmp_path / "runs" / "cpu" / "version_0" / "config.yaml").read_text()
    assert "pipeline: device" in config and "max_time: 00:00:00:03" in config
    assert re.search(r"optimizer:\n +name: muon\n", config)
    out = proc.stdout + proc.stderr
    assert "\x1b[" not in out  # no terminal colour codes in a log (wandb's closing lines included)
    assert "upload later with `vit-sync runs/cpu/version_0` on a machine with network" in out
    for noise in ("Loading `train_dataloader` to estimate", "Trainer already configured", "| FLOPs"):
        assert noise not in out, noise
    flops = re.search(r"([\d.]+) M\s+Total Flops", out)  # the notes' count of the cpu recipe's model, not 0
    assert flops and float(flops.group(1)) == pytest.approx(flops_per_image_of_cpu_recipe() / 1e6, abs=0.1)
    assert re.search(TEST_LINE, out) and (tmp_path / "runs" / "cpu" / "version_0" / "results.json").is_file()
    (records,) = (tmp_path / "runs" / "cpu" / "version_0" / "wandb").glob("offline-run-*/run-*.wandb")
    data = b"".join(wandb_records(records))
    assert b"cifar-vits" in data and b"my-team" in data


def flops_per_image_of_cpu_recipe() -> int:
    from vit.models.model import ViTConfig, flops_per_image

    return flops_per_image(ViTConfig(dim=64, depth=4, heads=4, mlp_ratio=2.0))
