"""Model step: our ViT against timm's ``VisionTransformer`` of identical shape, same batch, same dtype, same
optimizer. The two models are timed in alternation (ours, timm, ours, timm, ...) and the median of the
rounds is reported, so a drift in the machine's speed hits both alike."""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext

import torch

from vit.benchmark.common import scale, sync
from vit.benchmark.patch_embedding import bench_patch_embedding
from vit.benchmark.report import format_table
from vit.models.model import PRESETS, ViTConfig, VisionTransformer


def timm_twin(model: VisionTransformer) -> torch.nn.Module:
    """timm's VisionTransformer with exactly our model's shape."""
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    c = model.config
    return TimmViT(img_size=c.image_size, patch_size=c.patch_size, in_chans=c.in_channels,
                   num_classes=c.num_classes, embed_dim=c.dim, depth=c.depth, num_heads=c.heads,
                   mlp_ratio=c.mlp_ratio)


def _step_fn(model, images, labels, train: bool, autocast):
    if train:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            with autocast():
                loss = torch.nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    else:
        @torch.inference_mode()
        def step():
            with autocast():
                model(images)
    return step


def bench_model(preset: str, batch_size: int, device: torch.device, dtype: torch.dtype,
                steps: int, rounds: int, warmup: int = 2, compile_model: bool = False) -> dict:
    """Train and inference images/s (and peak memory on GPU) for ours vs timm's twin (both compiled
    with ``compile_model``)."""
    torch.manual_seed(0)
    ours = VisionTransformer(ViTConfig(**PRESETS[preset])).to(device)
    theirs = timm_twin(ours).to(device)
    if compile_model:
        ours.compile()
        theirs.compile()
    images = torch.randn(batch_size, 3, ours.config.image_size, ours.config.image_size, device=device)
    labels = torch.randint(0, ours.config.num_classes, (batch_size,), device=device)
    if dtype == torch.float32:
        autocast = nullcontext
    else:
        def autocast():
            return torch.autocast(device.type, dtype=dtype)
    result = {"preset": preset, "batch_size": batch_size, "dtype": str(dtype).removeprefix("torch."),
              "compiled": compile_model, "params_M": sum(p.numel() for p in ours.parameters()) / 1e6}
    for mode in ("train", "infer"):
        steps_fn = {}
        for name, model in (("ours", ours), ("timm", theirs)):
            model.train(mode == "train")
            steps_fn[name] = _step_fn(model, images, labels, mode == "train", autocast)
            for _ in range(warmup):
                steps_fn[name]()
        times = {"ours": [], "timm": []}
        peak = {}
        for _ in range(rounds):
            for name in ("ours", "timm"):
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                sync(device)
                start = time.perf_counter()
                for _ in range(steps):
                    steps_fn[name]()
                sync(device)
                times[name].append(time.perf_counter() - start)
                if device.type == "cuda":
                    peak[name] = torch.cuda.max_memory_allocated(device) / 2**20
        for name in ("ours", "timm"):
            result[f"{mode}_img_s_{name}"] = batch_size * steps / statistics.median(times[name])
            if peak:
                result[f"{mode}_peak_MiB_{name}"] = peak[name]
        result[f"{mode}_ratio"] = result[f"{mode}_img_s_ours"] / result[f"{mode}_img_s_timm"]
    return result


def section(report: dict, args, device: torch.device, dtype: torch.dtype) -> None:
    steps, rounds, presets, batch = scale(args)
    report["patch_embedding"] = [bench_patch_embedding(presets[0], batch, device, rounds)]
    print("# patch embedding E, forward+backward, images/s: patchify + Linear vs timm's strided conv")
    print(format_table(report["patch_embedding"], ["preset", "batch_size", "img_s_ours", "img_s_conv", "ratio"]))
    report["model"] = [bench_model(p, batch, device, dtype, steps, rounds, warmup=1 if args.quick else 2,
                                   compile_model=args.compile) for p in presets]
    print("# model step, images/s, ours vs timm's VisionTransformer of the same shape")
    print(format_table(report["model"], ["preset", "batch_size", "dtype", "train_img_s_ours", "train_img_s_timm",
                                         "train_ratio", "infer_img_s_ours", "infer_img_s_timm", "infer_ratio"]
                       + (["train_peak_MiB_ours", "train_peak_MiB_timm"] if device.type == "cuda" else [])))
