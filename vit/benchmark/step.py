"""The whole training step on the device path, images/s and the FLOP/s it achieves."""

from __future__ import annotations

import time

import torch

from vit.benchmark import peak
from vit.benchmark.common import scale, sync
from vit.benchmark.report import format_table
from vit.model import PRESETS, ViTConfig, flops_per_image


def bench_training_step(preset: str, batch_size: int, device: torch.device, dtype: torch.dtype, steps: int,
                        compile_model: bool, config: ViTConfig | None = None, muon_ns: torch.dtype | None = None) -> dict:
    """Whole step on the device path: batch (crop+flip) → normalise → forward → loss → backward → AdamW (or,
    with ``muon_ns``, the recipe's Muon with its Newton–Schulz iteration in that dtype), of the preset's model
    (or ``config``'s, named ``preset``)."""
    from vit.device_data import DeviceBatches
    from vit.module import ViTClassifier
    from vit.preprocessing import CIFAR10_MEAN, CIFAR10_STD, Normalize

    torch.manual_seed(0)
    normalize = Normalize(CIFAR10_MEAN, CIFAR10_STD).to(device)
    module = ViTClassifier(arch=config or ViTConfig(**PRESETS[preset]), optimizer={"name": "muon" if muon_ns else "adamw"})
    model = module.model.to(device).train()
    if compile_model:
        model.compile()
    fused = {"fused": True} if device.type == "cuda" else {}
    if muon_ns:
        from vit.optim import Muon

        opt = Muon(module.param_groups(1e-4, 1e-4), lr=1e-4, weight_decay=0.05, ns_dtype=muon_ns)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **fused)
    n = batch_size * (steps + 3)
    images = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, device=device)
    labels = torch.randint(0, 10, (n,), device=device)
    batches = iter(DeviceBatches(images, labels, batch_size, seed=0, position=lambda n, per_batch: (0, 0)))
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    def step():
        x, y = next(batches)
        with autocast:
            loss = torch.nn.functional.cross_entropy(model(normalize(x)), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    img_s = batch_size * steps / (time.perf_counter() - start)
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
