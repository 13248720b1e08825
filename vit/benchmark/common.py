"""What the sections share: their error (BenchmarkError), the device's clock, how many steps and rounds a section measures, and an
untrained checkpoint as vit-train writes it."""

from __future__ import annotations

import torch

from vit.exits import ConfigError
from vit.models.model import ViTConfig, VisionTransformer


class BenchmarkError(ConfigError):
    """A benchmark that cannot run as asked; the message says why (exit 2)."""


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def scale(args) -> tuple[int, int, list[str], int]:
    """(steps, rounds, presets, batch size) of a section: one tiny round of one preset under --quick."""
    quick = args.quick
    steps, rounds = (1, 1) if quick else (args.steps, args.rounds)
    presets = ["vit_tiny"] if quick else args.presets
    batch = 8 if quick else args.batch_size
    return steps, rounds, presets, batch


def write_checkpoint(path, config: ViTConfig) -> None:
    """A checkpoint as vit-train writes it (weights + metadata), of an untrained model."""
    from vit.models.preprocessing import Metadata

    model = VisionTransformer(config)
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "vit": Metadata(config, [str(i) for i in range(config.num_classes)], (0.5,) * 3,
                                (0.25,) * 3).to_dict()}, path)
