"""vit-classify's throughput: decoding in DataLoader workers against the main process."""

from __future__ import annotations

import time

import torch

from vit.benchmark.common import write_checkpoint
from vit.benchmark.report import format_table
from vit.models.model import ViTConfig


def bench_classify(n: int, workers: int) -> dict:
    """vit-classify's work on ``n`` generated photos of mixed sizes (64–640 px, JPEG and PNG), images/s
    (vit.inference.classify_files, batch 64, top 3; start-up and the checkpoint's loading excluded): decoding
    in ``workers`` DataLoader processes vs in the main process. The model is the cpu recipe's (D=64, L=4), so decoding is what the workers share."""
    import tempfile
    from pathlib import Path

    import numpy as np
    from PIL import Image

    from vit.data.images import find_images
    from vit.inference.classifier import classify_files, load_classifier

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "images").mkdir()
        for i in range(n):
            h, w = rng.integers(64, 641, 2)
            ramp = np.linspace(0, 255, w)[None, :, None] * rng.random(3) + rng.normal(0, 12, (h, w, 3))
            image = Image.fromarray(np.clip(ramp, 0, 255).astype(np.uint8))
            image.save(tmp / "images" / (f"{i:05d}.jpg" if i % 4 else f"{i:05d}.png"), quality=90)
        ckpt = tmp / "model.ckpt"
        write_checkpoint(ckpt, ViTConfig(dim=64, depth=4, heads=4, mlp_ratio=2.0))
        row = {"images": n, "workers": workers}
        clf = load_classifier(ckpt)
        for name, w in (("one_process", 0), ("workers", workers)):
            start = time.perf_counter()
            classify_files(clf, find_images([tmp / "images"]), 3, 64, w)  # what vit-classify does with them
            row[f"img_s_{name}"] = n / (time.perf_counter() - start)
    row["ratio"] = row["img_s_workers"] / row["img_s_one_process"]
    return row


def section(report: dict, args, device: torch.device, dtype: torch.dtype) -> None:
    report["classify"] = bench_classify(40 if args.quick else args.classify_images, args.workers)
    print(f"# vit-classify throughput on generated photos of mixed sizes, images/s: "
          f"{args.workers} decoding workers vs the main process")
    print(format_table([report["classify"]], ["images", "workers", "img_s_one_process", "img_s_workers", "ratio"]))
