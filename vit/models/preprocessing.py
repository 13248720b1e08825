"""Preprocessing, defined once: what training, validation, classify, rollout, export and benchmark
all do to an image, and the metadata a checkpoint carries so that inference does the same.

    uint8 3×H×W ──resize──▶ uint8 3×S×S ──Normalize──▶ float (x/255 − mean) / std
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from torchvision.transforms.v2 import functional as TF

from vit.exits import ConfigError
from vit.models.model import ViTConfig

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def resize(image: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 (B×)C×H×W → (B×)C×S×S, antialiased bilinear; an image already S×S is returned as is."""
    return image if tuple(image.shape[-2:]) == (size, size) else TF.resize(image, [size, size], antialias=True)


class Normalize(nn.Module):
    """uint8 B×C×H×W → float (x/255 − mean) / std, on the batch's device."""

    def __init__(self, mean, std):
        super().__init__()
        if len(mean) != len(std) or min(std) <= 0:
            raise ConfigError(f"mean and std need one value per channel each (std > 0), got {mean}, {std}")
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return (images.float() / 255 - self.mean) / self.std


@dataclass
class Metadata:
    """What a trained model needs besides its weights: the architecture, class names, mean/std."""

    config: ViTConfig
    class_names: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self):
        if len(self.class_names) != self.config.num_classes:
            raise ValueError(f"{len(self.class_names)} class names for {self.config.num_classes} classes")
        if not len(self.mean) == len(self.std) == self.config.in_channels:
            raise ValueError(f"mean and std need {self.config.in_channels} values each")

    def to_dict(self) -> dict:
        """Plain types only, so ``torch.load(weights_only=True)`` and JSON both read it."""
        return {"config": asdict(self.config), "class_names": list(self.class_names),
                "mean": [float(m) for m in self.mean], "std": [float(s) for s in self.std]}

    @classmethod
    def from_dict(cls, meta) -> "Metadata":
        """Raises ValueError (or TypeError) saying what is missing or wrong."""
        if not isinstance(meta, dict) or not {"config", "class_names", "mean", "std"} <= set(meta):
            raise ValueError("not a vit model (no model config, class names and mean/std)")
        return cls(ViTConfig(**meta["config"]), list(meta["class_names"]), tuple(meta["mean"]), tuple(meta["std"]))

    def normalize(self) -> Normalize:
        return Normalize(self.mean, self.std)
