"""The whole training step on the device path, images/s and the FLOP/s it achieves."""

from __future__ import annotations

import contextlib
import time
from typing import Callable

import torch

from vit.benchmark import peak
from vit.benchmark.common import scale, sync
from vit.benchmark.report import format_table
from vit.models.model import PRESETS, ViTConfig, flops_per_image

PARTS = ("data", "model", "optimizer")  # the step's record_function ranges (training_step(parts=True))


def training_step(config: ViTConfig, batch_size: int, device: torch.device, dtype: torch.dtype, batches: int,
                  compile_options: dict | None = None, muon_ns: torch.dtype | None = None,
                  parts: bool = False, auto_augment: str | None = None) -> tuple[Callable[[], None], torch.nn.Module]:
    """One training step on the device path as a function of no arguments, and its model: the batch
    (DeviceBatches' crop and flip of uint8 images on the device, ``batches`` of them in all) → normalise →
    forward → loss → backward → AdamW (or, with ``muon_ns``, the recipe's Muon over the module's
    ``param_groups``, its Newton–Schulz iteration in that dtype), under autocast to ``dtype``.
    ``compile_options``: the model is torch.compile'd with them, and Muon's step as training compiles it
    (None: eager). ``parts``: the batch, normalise to backward, and the optimizer's
    step with zero_grad run in ``torch.profiler.record_function`` ranges named as PARTS. ``auto_augment``:
    DeviceBatches' AutoAugment after crop and flip (compiled with the model)."""
    from vit.data.device_data import DeviceBatches
    from vit.training.module import ViTClassifier
    from vit.models.preprocessing import CIFAR10_MEAN, CIFAR10_STD, Normalize

    torch.manual_seed(0)
    normalize = Normalize(CIFAR10_MEAN, CIFAR10_STD).to(device)
    module = ViTClassifier(arch=config, optimizer={"name": "muon" if muon_ns else "adamw"})
    model = module.model.to(device).train()
    if compile_options is not None:
        model.compile(**compile_options)
    fused = {"fused": True} if device.type == "cuda" else {}
    if muon_ns:
        from vit.training.optim import Muon

        opt = Muon(module.param_groups(1e-4, 1e-4), lr=1e-4, weight_decay=0.05, ns_dtype=muon_ns,
                   compiled=compile_options is not None)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **fused)
    n = batch_size * batches
    images = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, device=device)
    labels = torch.randint(0, 10, (n,), device=device)
    data = iter(DeviceBatches(images, labels, batch_size, seed=0, position=lambda n, per_batch: (0, 0),
                              auto_augment=auto_augment, compile=compile_options is not None))
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    part = torch.profiler.record_function if parts else lambda name: contextlib.nullcontext()

    def step():
        with part("data"):
            x, y = next(data)
        with part("model"):
            with autocast:
                loss = torch.nn.functional.cross_entropy(model(normalize(x)), y)
            loss.backward()
        with part("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)

    return step, model


def timed(step: Callable[[], None], steps: int, device: torch.device) -> float:
    """Seconds of ``steps`` calls of ``step``, the device synchronised before and after."""
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return time.perf_counter() - start


def bench_training_step(preset: str, batch_size: int, device: torch.device, dtype: torch.dtype, steps: int,
                        compile_model: bool, config: ViTConfig | None = None, muon_ns: torch.dtype | None = None) -> dict:
    """Whole step on the device path (``training_step``): batch (crop+flip) → normalise → forward → loss →
    backward → AdamW (or, with ``muon_ns``, the recipe's Muon with its Newton–Schulz iteration in that
    dtype), of the preset's model (or ``config``'s, named ``preset``)."""
    step, model = training_step(config or ViTConfig(**PRESETS[preset]), batch_size, device, dtype, steps + 3,
                                {} if compile_model else None, muon_ns)
    for _ in range(3):
        step()
    img_s = batch_size * steps / timed(step, steps, device)
    tflops = flops_per_image(model.config, train=True) * img_s / 1e12
    row = {"preset": preset, "batch_size": batch_size, "dtype": str(dtype).removeprefix("torch."),
           "compiled": compile_model, "optimizer": f"muon, NS {str(muon_ns).removeprefix('torch.')}" if muon_ns else "adamw",
           "img_s": img_s, "gflop_per_img": flops_per_image(model.config, True) / 1e9,
           "achieved_tflops": tflops}
    if device.type == "cuda":
        from lightning.fabric.utilities.throughput import get_available_flops

        peak = get_available_flops(device, dtype)  # Lightning's table of dense peaks
        row["mfu"] = tflops * 1e12 / peak if peak else None
    return row


def section(report: dict, args, device: torch.device, dtype: torch.dtype) -> None:
    """The training step of each preset, its achieved TFLOP/s and their fraction of the machine's matmul peak
    (measured first, when the report has none)."""
    peak.section(report, args, device, dtype)
    steps, rounds, presets, batch = scale(args)
    report["step"] = [bench_training_step(p, batch if args.quick else args.step_batch_size, device, dtype, steps,
                                          args.compile) for p in presets]
    for row in report["step"]:
        row["peak_fraction"] = row["achieved_tflops"] / report["peak"]["tflops"]
    print(f"# whole training step (device data path + forward + backward + AdamW); peak_fraction: of the "
          f"{report['peak']['size']}² {report['peak']['dtype']} matmul's {report['peak']['tflops']:.3g} TFLOP/s")
    print(format_table(report["step"], ["preset", "batch_size", "dtype", "compiled", "img_s", "gflop_per_img",
                                        "achieved_tflops", "peak_fraction"] + (["mfu"] if device.type == "cuda" else [])))
