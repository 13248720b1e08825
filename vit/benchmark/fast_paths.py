"""The cpu recipe's model on the CPU: which fast paths pay at that shape."""

from __future__ import annotations

import torch

from vit.benchmark.common import scale
from vit.benchmark.report import format_table
from vit.benchmark.step import bench_training_step
from vit.models.model import ViTConfig


def recipe_arch(name: str) -> ViTConfig:
    """A recipe's architecture (its own over the default recipe's, as vit-train reads them)."""
    import yaml

    from vit import configs

    arch = {}
    for recipe in (configs.DEFAULT, name):
        arch.update((yaml.safe_load(configs.path(recipe).read_text()).get("model") or {}).get("arch") or {})
    return ViTConfig(**{k: v for k, v in arch.items() if k in ViTConfig.__dataclass_fields__})


def bench_fast_paths(batch_size: int, steps: int, rounds: int, compiled: bool) -> list[dict]:
    """The cpu recipe's model (at full size, no token dropping), whole training steps in fp32 against bf16
    autocast (and torch.compile when ``compiled``), with AdamW, and with the recipe's Muon, its Newton–Schulz
    iteration in bfloat16 (timm's) and in float32; with 1 thread and with every thread torch has: which of
    the CPU's fast paths pay at that shape. Alternating rounds, the median."""
    import statistics

    config, threads = recipe_arch("cpu"), torch.get_num_threads()
    variants = [(torch.float32, False, None), (torch.bfloat16, False, None)] + [(torch.float32, True, None)] * compiled
    variants += [(torch.float32, False, torch.bfloat16), (torch.float32, False, torch.float32)]
    rows = []
    try:
        for n in sorted({1, threads}):
            torch.set_num_threads(n)
            measured = {v: [] for v in variants}
            for _ in range(rounds):
                for dtype, comp, ns in variants:
                    measured[(dtype, comp, ns)].append(bench_training_step(
                        "cpu recipe", batch_size, torch.device("cpu"), dtype, steps, comp, config, ns))
            for values in measured.values():
                rows.append({"model": "cpu recipe", "threads": n, "batch_size": batch_size,
                             **{k: values[0][k] for k in ("dtype", "compiled", "optimizer")},
                             "img_s": statistics.median(v["img_s"] for v in values)})
    finally:
        torch.set_num_threads(threads)
    return rows


def section(report: dict, args, device: torch.device, dtype: torch.dtype) -> None:
    steps, rounds, presets, batch = scale(args)
    report["fast-paths"] = bench_fast_paths(8 if args.quick else 128, 1 if args.quick else 10, rounds, args.compile)
    print("# the cpu recipe's model, whole training step on the CPU: fp32, bf16 autocast"
          + (", torch.compile" if args.compile else "") + "; images/s")
    print(format_table(report["fast-paths"], ["model", "threads", "batch_size", "dtype", "compiled", "optimizer",
                                          "img_s"]))
