"""Muon with the precision of its Newton–Schulz iteration chosen: timm's Muon runs it in bfloat16 always.

On a CPU without bf16 units (an AMD EPYC Milan, most laptops) bfloat16 matrix products are emulated, and
the iteration costs the cpu recipe a large share of its steps (the benchmark's fast-paths section measures it:
docs/results.md). On a GPU bfloat16 is the fast path, and timm's choice stays.
"""

from __future__ import annotations

import functools

import timm.optim.muon as timm_muon
import torch


def ns_dtype(device: torch.device) -> torch.dtype:
    """The iteration's dtype: bfloat16 on a GPU, float32 on a CPU. The rule reads the device's type alone, so
    every process of a run chooses alike (its updates must agree)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


class Muon(timm_muon.Muon):
    """timm's Muon (its parameter groups, fallback AdamW and lr scaling) whose Newton–Schulz iteration runs
    in ``ns_dtype``. timm's step calls its module's ``zeropower_via_newtonschulz`` with the dtype left at its
    bfloat16 default (no argument of Muon reaches it), so the step swaps that function for one with the dtype
    given, for the step's duration (vit.private_api lists this)."""

    def __init__(self, params, ns_dtype: torch.dtype = torch.bfloat16, **kwargs):
        super().__init__(params, **kwargs)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure=None):
        if self.ns_dtype == torch.bfloat16:
            return super().step(closure)
        original = timm_muon.zeropower_via_newtonschulz
        timm_muon.zeropower_via_newtonschulz = functools.partial(original, dtype=self.ns_dtype)
        try:
            return super().step(closure)
        finally:
            timm_muon.zeropower_via_newtonschulz = original
