"""Seconds to classify one image from the shell."""

from __future__ import annotations

import statistics
import time

import torch

from vit.benchmark.common import write_checkpoint
from vit.benchmark.report import format_table
from vit.models.model import PRESETS, ViTConfig


def bench_startup(repeats: int) -> dict:
    """Seconds to classify one image from the shell, against `python -c "import torch, torchvision"`."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from PIL import Image

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "model.ckpt"
        write_checkpoint(ckpt, ViTConfig(**PRESETS["vit_tiny"]))
        Image.new("RGB", (64, 48), (120, 30, 200)).save(Path(tmp) / "cat.png")
        commands = {"import": [sys.executable, "-c", "import torch, torchvision"],
                    "classify": [sys.executable, "-m", "vit.commands.classify", "--checkpoint", str(ckpt),
                                 str(Path(tmp) / "cat.png")]}
        times = {k: [] for k in commands}
        for _ in range(repeats):
            for name, cmd in commands.items():
                start = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True)
                times[name].append(time.perf_counter() - start)
    row = {f"s_{k}": statistics.median(v) for k, v in times.items()}
    row["ratio"] = row["s_classify"] / row["s_import"]
    return row


def section(report: dict, args, device: torch.device, dtype: torch.dtype) -> None:
    report["startup"] = bench_startup(1 if args.quick else args.startup_repeats)
    print("# classify one image from the shell vs `python -c 'import torch, torchvision'`, seconds (median)")
    print(format_table([report["startup"]], ["s_import", "s_classify", "ratio"]))
