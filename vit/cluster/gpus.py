"""GPUs on a cluster: GPUs allocated that torch cannot use (a driver older than torch's CUDA, a CPU build)
stop the run with one line naming both (exit 2, vit.exits); NCCL's collective timeouts reach Python as
errors (exit 5) instead of ending the process without a word."""

from __future__ import annotations

import os
import subprocess

from vit.cluster import launch
from vit.exits import AcceleratorUnusable


def driver_report() -> str:
    """What the NVIDIA driver says of itself, in a few words."""
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
    """A job given GPUs (CUDA_VISIBLE_DEVICES, SLURM's gres) where torch cannot use them stops with one line
    (exit 2) instead of training on the CPU."""
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
    """NCCL's watchdog, on a collective that outlives the process group's timeout, by default ends the process
    from its own thread (TORCH_NCCL_ASYNC_ERROR_HANDLING=3: SIGABRT, no message of ours). With 2 it aborts the
    communicator only, and the main thread's collective raises DistBackendError, which vit.failures reads as
    gloo's timeouts: the same one line and exit 5. Set before the process group is made; a value the
    user set is kept."""
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
