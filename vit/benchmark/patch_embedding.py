"""The patch embedding E, forward+backward: patchify + Linear (ours) against timm's strided convolution
(measured with the model section)."""

from __future__ import annotations

import statistics
import time

import torch

from vit.benchmark.common import sync
from vit.models.model import PRESETS, ViTConfig, VisionTransformer


def bench_patch_embedding(preset: str, batch_size: int, device: torch.device, rounds: int) -> dict:
    """Forward+backward of E as patchify + Linear (ours) against timm's stride-P convolution."""
    from timm.layers import PatchEmbed

    model = VisionTransformer(ViTConfig(**PRESETS[preset])).to(device)
    c = model.config
    ours = model.patch_embedding
    conv = PatchEmbed(c.image_size, c.patch_size, c.in_channels, c.dim).to(device)
    images = torch.randn(batch_size, c.in_channels, c.image_size, c.image_size, device=device,
                         requires_grad=True)
    times = {"ours": [], "conv": []}
    for r in range(rounds + 2):
        for name, module in (("ours", ours), ("conv", conv)):
            sync(device)
            start = time.perf_counter()
            for _ in range(10):
                module(images).sum().backward()
            sync(device)
            if r >= 2:  # the first two rounds warm up
                times[name].append(time.perf_counter() - start)
    ours_s, conv_s = (10 * batch_size / statistics.median(times[k]) for k in ("ours", "conv"))
    return {"preset": preset, "batch_size": batch_size, "img_s_ours": ours_s, "img_s_conv": conv_s,
            "ratio": ours_s / conv_s}
