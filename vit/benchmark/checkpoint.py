"""The step checkpoint's cost: seconds per save and its share of training time."""

from __future__ import annotations

import statistics
import time

import torch

from vit.benchmark.report import format_table
from vit.data.cifar import write_fake
from vit.models.model import ViTConfig


def bench_checkpoint(device: torch.device, repeats: int, interval_minutes: float = 10.0) -> list[dict]:
    """The step checkpoint's cost: seconds per ``trainer.save_checkpoint`` (what the rolling step checkpoint and
    the preemption stop write: weights, optimizer, EMA, loops, callbacks' states, RNG states, to local disk),
    median of ``repeats``, after one training step of the default recipe's model (Muon, EMA) and of the cpu
    recipe's; and its share of training time when written every ``interval_minutes``."""
    import tempfile
    import warnings
    from pathlib import Path

    import lightning as L

    from vit.data.datamodules import CIFAR10DataModule
    from vit.training.module import ViTClassifier
    from vit.data.resume import RNGStates

    shapes = {"vit_cifar10": ViTConfig(dim=192, depth=9, heads=12, mlp_ratio=2.0),
              "cpu": ViTConfig(dim=64, depth=4, heads=4, mlp_ratio=2.0)}
    rows = []
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tmp = Path(tmp)
        write_fake(tmp, 256 // 5, 256 // 5)
        for recipe, config in shapes.items():
            model = ViTClassifier(arch=config, optimizer={"name": "muon"}, ema_decay=0.999)
            dm = CIFAR10DataModule(root=str(tmp), batch_size=64, val_size=64, num_workers=0, download=False)
            trainer = L.Trainer(accelerator=device.type, devices=1, max_steps=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                limit_val_batches=0, callbacks=[RNGStates()], default_root_dir=tmp)
            trainer.fit(model, datamodule=dm)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                trainer.save_checkpoint(tmp / "step.ckpt")
                times.append(time.perf_counter() - start)
            seconds = statistics.median(times)
            rows.append({"recipe": recipe, "params_M": round(sum(p.numel() for p in model.model.parameters()) / 1e6, 2),
                         "MB": round((tmp / "step.ckpt").stat().st_size / 2**20, 1), "s_per_save": round(seconds, 3),
                         "interval_min": interval_minutes,
                         "share_percent": round(100 * seconds / (60 * interval_minutes), 4)})
    return rows


def section(report: dict, args, device: torch.device, dtype: torch.dtype) -> None:
    report["checkpoint"] = bench_checkpoint(device, 1 if args.quick else args.rounds)
    print("# the step checkpoint: seconds per save (trainer.save_checkpoint, local disk) and its share of "
          "training at the default interval")
    print(format_table(report["checkpoint"], ["recipe", "params_M", "MB", "s_per_save", "interval_min",
                                              "share_percent"]))
