"""The machine's matmul peak, what the training step's FLOP/s are a fraction of: a large square matrix
product (``SIZE``², 2·SIZE³ FLOP) in the benchmark's dtype (float32 on a CPU, bfloat16 on a GPU unless
--dtype says otherwise), the best of ``REPEATS`` timings. Measured once per report, by the step section
(or on its own, ``--sections peak``)."""

from __future__ import annotations

import math
import time

import torch

from vit.benchmark.common import sync
from vit.benchmark.report import format_table

SIZE = 4096  # smaller products leave a CPU's or a GPU's matrix units short of their peak
QUICK_SIZE = 1024  # --quick only: a check that the section runs, short of the peak
REPEATS = 5
REPEAT_SECONDS = 0.2  # each timing runs enough products back to back to last about this long


def matmul_peak(device: torch.device, dtype: torch.dtype, size: int = SIZE, repeats: int = REPEATS) -> dict:
    """TFLOP/s of ``size``×``size`` matrix products in ``dtype`` on ``device``: the best of ``repeats``
    timings, each of as many products back to back as last about REPEAT_SECONDS (one at least)."""
    generator = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(size, size, device=device, dtype=dtype, generator=generator) for _ in range(2))
    out = torch.empty(size, size, device=device, dtype=dtype)

    def seconds(products: int) -> float:
        sync(device)
        start = time.perf_counter()
        for _ in range(products):
            torch.mm(a, b, out=out)
        sync(device)
        return time.perf_counter() - start

    seconds(1)  # warm up (the library picks its kernel, the memory is touched)
    products = max(1, math.ceil(REPEAT_SECONDS / seconds(1)))
    best = min(seconds(products) / products for _ in range(repeats))
    return {"tflops": 2 * size**3 / best / 1e12, "size": size, "dtype": str(dtype).removeprefix("torch."),
            "repeats": repeats, "products_per_repeat": products, "threads": torch.get_num_threads()}


def section(report: dict, args, device: torch.device, dtype: torch.dtype) -> None:
    """The peak into ``report["peak"]``, once per report (the step section measures it when absent)."""
    if "peak" in report:
        return
    report["peak"] = matmul_peak(device, dtype, QUICK_SIZE if args.quick else SIZE)
    print(f"# matmul peak: best of {REPEATS} timings of a square matrix product, TFLOP/s")
    print(format_table([report["peak"]], ["size", "dtype", "threads", "repeats", "products_per_repeat", "tflops"]))
