"""An image-folder run's start at scale: seconds from the command to its first optimizer step, on 2
processes (Lightning's DDP on the CPU), for a first start (the folder's index built: every image checked)
and a requeue's (the index read: one stat per file, no image opened)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import lightning as L
import torch

from vit.benchmark.report import format_table

CLASSES = 10
SIDE = 32  # pixels: small JPEGs, so that the folder's size, not its bytes, is what is measured


class FirstStep(L.Callback):
    """Writes to the file ``path`` the wall-clock times (process 0) at which the data was set up (the
    folder's index read or built) and the first optimizer step ended."""

    def __init__(self, path: str):
        self.path = path

    def setup(self, trainer, pl_module, stage):  # (right after the data module's setup)
        if trainer.is_global_zero:
            Path(self.path).with_suffix(".data").write_text(f"{time.time()!r}\n")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.is_global_zero and trainer.global_step >= 1 and not os.path.exists(self.path):
            Path(self.path).write_text(f"{time.time()!r}\n")


def write_folder(root: Path, images: int) -> None:
    """``images`` JPEGs of SIDE × SIDE px (noise around a colour per class) in ``root/train/<class>/``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    colours = rng.integers(40, 216, (CLASSES, 3))
    for c in range(CLASSES):
        (root / "train" / f"c{c}").mkdir(parents=True, exist_ok=True)
    noise = rng.integers(-30, 30, (256, SIDE, SIDE, 3))
    for i in range(images):
        c = i % CLASSES
        pixels = np.clip(colours[c] + noise[i % 256], 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(root / "train" / f"c{c}" / f"{i:07d}.jpg", quality=85)


def start(root: Path, runs: Path, index: Path, marker: Path) -> tuple[float, float, str]:
    """Seconds from launching vit-train (2 processes) to its first optimizer step, and to its data's setup
    end, and its output."""
    from vit.plans import REPO
    from vit.plans.run_here import program

    marker.unlink(missing_ok=True)
    command = [*program(REPO, "train"), "--config", "smoke", "--data", "vit.data.ImageFolderDataModule",
               "--data.root", str(root), "--data.index", str(index), "--data.num_workers", "2",
               "--data.batch_size", "32", "--data.image_size", str(SIDE), "--data.val_size", "0.01",
               "--trainer.default_root_dir", str(runs), "--trainer.devices", "2", "--trainer.strategy", "ddp",
               "--trainer.accelerator", "cpu", "--trainer.max_steps", "1", "--trainer.logger", "false",
               "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
               "--trainer.limit_val_batches", "0", "--test_after_fit", "false",
               "--trainer.callbacks+=vit.benchmark.folders.FirstStep", "--trainer.callbacks.path", str(marker)]
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    env.pop("VIT_RUN_DIR", None)
    begin = time.time()
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not marker.is_file():
        from vit.benchmark.common import BenchmarkError

        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        raise BenchmarkError(f"section folders: vit-train ended with exit {proc.returncode} before its first "
                             f"step: {tail}")
    return (float(marker.read_text()) - begin, float(marker.with_suffix(".data").read_text()) - begin,
            proc.stdout + proc.stderr)


def bench_folders(images: int) -> dict:
    """The two starts, and inside them the part the index changes, in this process: the walk alone (a
    requeue's) against the walk and the check of every image (a first start's, in 2 threads as with
    --data.num_workers 2). The generated files are in the page cache: the first start reads them from
    memory, not from the disk, so its check is the least it costs."""
    from vit.data.folder_index import index, walk

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        began = time.perf_counter()
        write_folder(tmp / "photos", images)
        generated = time.perf_counter() - began
        began = time.perf_counter()
        walk(tmp / "photos", [f"c{c}" for c in range(CLASSES)])
        walked = time.perf_counter() - began
        began = time.perf_counter()
        index(tmp / "photos", [f"c{c}" for c in range(CLASSES)], None, 2, lambda line: None)
        checked = time.perf_counter() - began
        kept, marker = tmp / "folder_index.json", tmp / "first_step"
        first, first_data, said = start(tmp / "photos", tmp / "runs", kept, marker)
        if not json.loads(kept.read_text())["images"] == images or "checking" not in said:
            from vit.benchmark.common import BenchmarkError

            raise BenchmarkError("section folders: the first start wrote no index of every image")
        requeue, requeue_data, said = start(tmp / "photos", tmp / "runs", kept, marker)
        if f"checking {images:,} images" in said:
            from vit.benchmark.common import BenchmarkError

            raise BenchmarkError("section folders: the second start checked the images again")
    return {"images": images, "side": SIDE, "processes": 2, "s_generate": generated, "s_walk": walked,
            "s_walk_and_check": checked, "ratio_walk": walked / checked,
            "s_first_start": first, "s_requeue": requeue, "ratio": requeue / first,
            "s_first_start_data": first_data, "s_requeue_data": requeue_data}


def section(report: dict, args, device: torch.device, dtype: torch.dtype) -> None:
    report["folders"] = bench_folders(2000 if args.quick else args.folder_images)
    print(f"# image folder of {report['folders']['images']:,} JPEGs, 2 processes: seconds from the command to the "
          f"first optimizer step")
    print(format_table([report["folders"]], ["images", "s_walk", "s_walk_and_check", "s_first_start_data", "s_first_start", "s_requeue_data",
                                         "s_requeue", "ratio"]))
