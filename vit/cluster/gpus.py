"""GPU checks: stop early when allocated GPUs are unusable by torch; make NCCL timeouts raise in Python."""

from __future__ import annotations

import os
import subprocess

from vit.cluster import launch
from vit.exits import AcceleratorUnusable


def driver_report() -> str:
    """A short description of the NVIDIA driver, from nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20)
    except FileNotFoundError:
        return "no NVIDIA driver answers here (nvidia-smi is not installed)"
    except subprocess.TimeoutExpired:
        return "nvidia-smi did not answer within 20 s"
    import re

    driver = re.search(r"Driver Version:\s*(\S+)", out.stdout)
    cuda = re.search(r"CUDA Version:\s*(\S+)", out.stdout)
    if out.returncode != 0 or not driver:
        first = next((line for line in (out.stdout + out.stderr).splitlines() if line.strip()), "no output")
        return f"nvidia-smi fails: {first.strip()}"
    return f"the driver is {driver.group(1)}" + (f", for CUDA up to {cuda.group(1)}" if cuda else "")


def check_gpus_usable() -> None:
    """Raise AcceleratorUnusable if GPUs were allocated but torch cannot use them, rather than silently use the CPU."""
    import torch

    given = launch.allocated_gpus()
    if given is None or torch.cuda.is_available():
        return
    built = f"torch {torch.__version__} is built for CUDA {torch.version.cuda}" if torch.version.cuda else \
        f"torch {torch.__version__} is a CPU-only build"
    raise AcceleratorUnusable(
        f"this job was given GPUs ({given}) but torch cannot use them: {built}, and {driver_report()}. Install a "
        f"torch built for this driver's CUDA (or load the cluster's own torch), or train on the CPU on purpose "
        f"with --trainer.accelerator cpu")


def nccl_errors_reach_python() -> None:
    """Make NCCL timeouts raise in the main thread instead of a silent SIGABRT; call before the group is made."""
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
