"""Where a training step of the default recipe's model goes, eager and compiled: its time split into the batch,
the model and the optimizer, counted with torch.profiler, and its kernel launches and host syncs."""

from __future__ import annotations

import bisect
from dataclasses import replace

import torch
from torch.autograd import DeviceType

from vit.benchmark import peak
from vit.benchmark.common import BenchmarkError
from vit.benchmark.fast_paths import recipe_arch
from vit.benchmark.report import format_table
from vit.benchmark.step import PARTS, timed, training_step
from vit.models.model import flops_per_image

# torch.compile's options per mode (None: eager): compiled, the model and Muon's step, as training compiles them
MODES = {"eager": None, "compiled": {"dynamic": False}}
WARMUP = 5  # steps before the measured ones: torch.compile compiles
QUICK_STEPS = 2
COLUMNS = ["mode", "batch_size", "dtype", "step_ms", "profiled_ms", "data_ms", "model_ms", "optimizer_ms", "rest_ms",
           "img_s", "achieved_tflops", "peak_fraction", "launches_per_step", "host_syncs_per_step"]


def part_ms(events, device: torch.device, steps: int) -> dict[str, float]:
    """ms per step of each of PARTS, from a profile of ``steps`` steps made with ``training_step(parts=True)``:
    on a CPU the time of its record_function ranges; on CUDA the GPU time of the kernels (memory copies and
    sets included) that the ops started inside its ranges launched, on any thread (the backward's too)."""
    ranges = sorted((e.time_range.start, e.time_range.end, e.name) for e in events
                    if e.name in PARTS and e.device_type == DeviceType.CPU)
    us = dict.fromkeys(PARTS, 0.0)
    if device.type != "cuda":
        for start, end, name in ranges:
            us[name] += end - start
        return {name: t / 1000 / steps for name, t in us.items()}
    started = {e.id: e.time_range.start for e in events  # the ops that kernels link to, by correlation id
               if e.device_type == DeviceType.CPU and not e.is_async and e.linked_correlation_id == 0}
    starts = [start for start, _, _ in ranges]
    for kernel in kernels(events):
        at = started.get(kernel.linked_correlation_id)
        i = bisect.bisect_right(starts, at) - 1 if at is not None else -1
        if i >= 0 and at < ranges[i][1]:
            us[ranges[i][2]] += kernel.time_range.elapsed_us()
    return {name: t / 1000 / steps for name, t in us.items()}


def kernels(events) -> list:
    """The profile's CUDA kernels, memory copies and sets (not its GPU-side annotation ranges)."""
    return [e for e in events if e.device_type == DeviceType.CUDA and not e.is_user_annotation]


def bench_breakdown(config, batch_size: int, device: torch.device, dtype: torch.dtype, steps: int, mode: str) -> dict:
    """``steps`` steady steps of ``training_step`` in ``mode`` (after WARMUP), with the recipe's Muon
    (Newton–Schulz in ``vit.training.optim.ns_dtype(device)``), timed, then the same number again under torch.profiler
    (CUDA's activities too where it is the device): ms per step of the timed steps (``step_ms``, and images/s
    and TFLOP/s from it) and of the profiled ones (``profiled_ms``), split into data, model, optimizer
    (``part_ms``) and the rest of it; kernel launches per step (on CUDA the kernels the GPU ran; elsewhere the aten ops outside compiled graphs that would launch one,
    ``vit.training.step_profile.count``) and host syncs per step."""
    from vit.training.optim import ns_dtype
    from vit.training.step_profile import count

    step, model = training_step(config, batch_size, device, dtype, WARMUP + 2 * steps, MODES[mode], ns_dtype(device),
                                parts=True, auto_augment="autoaugment")  # the recipes' device data path
    for _ in range(WARMUP):
        step()
    seconds = timed(step, steps, device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        profiled = timed(step, steps, device)
    events = profile.events()
    parts = part_ms(events, device, steps)
    counted = count(events, steps)
    img_s = batch_size * steps / seconds
    profiled_ms = 1000 * profiled / steps
    return {"mode": mode, "batch_size": batch_size, "dtype": str(dtype).removeprefix("torch."),
            "step_ms": 1000 * seconds / steps, "profiled_ms": profiled_ms,
            **{f"{name}_ms": ms for name, ms in parts.items()}, "rest_ms": profiled_ms - sum(parts.values()),
            "img_s": img_s, "achieved_tflops": flops_per_image(model.config, train=True) * img_s / 1e12,
            "launches_per_step": len(kernels(events)) / steps if device.type == "cuda"
            else counted["launching_ops_outside_compiled_per_step"],
            "host_syncs_per_step": counted["host_syncs_per_step"]}


def section(report: dict, args, device: torch.device, dtype: torch.dtype) -> None:
    """The default recipe's model (under --quick a small one of its shape, at batch 8) at each of
    --breakdown-batch-sizes in each of --breakdown-modes, beside the machine's matmul peak (measured first,
    when the report has none)."""
    from vit import configs

    modes = args.breakdown_modes.split(",")
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        raise BenchmarkError(f"--breakdown-modes: no mode {', '.join(unknown)} (there are {', '.join(MODES)})")
    sizes = [8] if args.quick else args.breakdown_batch_sizes
    steps = QUICK_STEPS if args.quick else args.breakdown_steps
    config = recipe_arch(configs.DEFAULT)
    if args.quick:
        config = replace(config, dim=32, depth=2, heads=2)
    peak.section(report, args, device, dtype)
    rows = []
    for mode in modes:
        for size in sizes:
            torch.compiler.reset()  # each model compiles afresh, within torch.compile's recompile limit
            rows.append(bench_breakdown(config, size, device, dtype, steps, mode))
            rows[-1]["peak_fraction"] = rows[-1]["achieved_tflops"] / report["peak"]["tflops"]
    report["breakdown"] = rows
    print(f"# where a training step goes: {configs.DEFAULT}'s model (D={config.dim}, L={config.depth}, "
          f"H={config.heads}), Muon; ms per step, data + model + optimizer + rest = profiled_ms (the steps under "
          f"torch.profiler; {'GPU kernel time' if device.type == 'cuda' else 'CPU time'} per part); peak_fraction: "
          f"of the {report['peak']['size']}² {report['peak']['dtype']} matmul's {report['peak']['tflops']:.3g} TFLOP/s")
    print(format_table(rows, COLUMNS))
