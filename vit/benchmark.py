"""Speed figures, measured in one run on whatever device is present (``scripts/benchmark.py``).

Model step: our ViT against timm's ``VisionTransformer`` of identical shape, same batch, same
dtype, same optimizer. The two models are timed in alternation (ours, timm, ours, timm, ...) and
the median of the rounds is reported, so a drift in the machine's speed hits both alike.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from contextlib import nullcontext

import torch

from vit.model import PRESETS, VisionTransformer


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
                steps: int, rounds: int, warmup: int = 2) -> dict:
    """Train and inference images/s (and peak memory on GPU) for ours vs timm's twin."""
    torch.manual_seed(0)
    ours = VisionTransformer(**PRESETS[preset]).to(device)
    theirs = timm_twin(ours).to(device)
    images = torch.randn(batch_size, 3, ours.config.image_size, ours.config.image_size, device=device)
    labels = torch.randint(0, ours.config.num_classes, (batch_size,), device=device)
    if dtype == torch.float32:
        autocast = nullcontext
    else:
        def autocast():
            return torch.autocast(device.type, dtype=dtype)
    result = {"preset": preset, "batch_size": batch_size, "dtype": str(dtype).removeprefix("torch."),
              "params_M": sum(p.numel() for p in ours.parameters()) / 1e6}
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
                _sync(device)
                start = time.perf_counter()
                for _ in range(steps):
                    steps_fn[name]()
                _sync(device)
                times[name].append(time.perf_counter() - start)
                if device.type == "cuda":
                    peak[name] = torch.cuda.max_memory_allocated(device) / 2**20
        for name in ("ours", "timm"):
            result[f"{mode}_img_s_{name}"] = batch_size * steps / statistics.median(times[name])
            if peak:
                result[f"{mode}_peak_MiB_{name}"] = peak[name]
        result[f"{mode}_ratio"] = result[f"{mode}_img_s_ours"] / result[f"{mode}_img_s_timm"]
    return result


def bench_patch_embedding(preset: str, batch_size: int, device: torch.device, rounds: int) -> dict:
    """Forward+backward of E as patchify + Linear (ours) against timm's stride-P convolution."""
    from timm.layers import PatchEmbed

    model = VisionTransformer(**PRESETS[preset]).to(device)
    c = model.config
    ours = model.patch_embedding
    conv = PatchEmbed(c.image_size, c.patch_size, c.in_channels, c.dim).to(device)
    images = torch.randn(batch_size, c.in_channels, c.image_size, c.image_size, device=device,
                         requires_grad=True)
    times = {"ours": [], "conv": []}
    for r in range(rounds + 2):
        for name, module in (("ours", ours), ("conv", conv)):
            _sync(device)
            start = time.perf_counter()
            for _ in range(10):
                module(images).sum().backward()
            _sync(device)
            if r >= 2:  # the first two rounds warm up
                times[name].append(time.perf_counter() - start)
    ours_s, conv_s = (10 * batch_size / statistics.median(times[k]) for k in ("ours", "conv"))
    return {"preset": preset, "batch_size": batch_size, "img_s_ours": ours_s, "img_s_conv": conv_s,
            "ratio": ours_s / conv_s}


def format_table(rows: list[dict], columns: list[str]) -> str:
    def fmt(v):
        return f"{v:.2f}" if isinstance(v, float) and abs(v) < 100 else (f"{v:.0f}" if isinstance(v, float) else str(v))

    cells = [columns] + [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run(args) -> dict:
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[
        args.dtype if args.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")]
    steps, rounds = (1, 1) if args.quick else (args.steps, args.rounds)
    presets = ["vit_tiny"] if args.quick else args.presets
    batch = 8 if args.quick else args.batch_size
    report = {"device": describe_device(device), "torch": torch.__version__, "model": []}
    for preset in presets:
        report["model"].append(bench_model(preset, batch, device, dtype, steps, rounds,
                                           warmup=1 if args.quick else 2))
    report["patch_embedding"] = [bench_patch_embedding(presets[0], batch, device, rounds)]
    print(f"# patch embedding E, forward+backward, images/s: patchify + Linear vs timm's strided conv")
    print(format_table(report["patch_embedding"], ["preset", "batch_size", "img_s_ours", "img_s_conv", "ratio"]))
    print(f"# model step on {report['device']} (torch {report['torch']}), images/s, ours vs timm")
    print(format_table(report["model"], ["preset", "batch_size", "dtype", "train_img_s_ours",
                                         "train_img_s_timm", "train_ratio", "infer_img_s_ours",
                                         "infer_img_s_timm", "infer_ratio"]))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.output}")
    return report
