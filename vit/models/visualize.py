"""Drawing helpers: a rollout heat map upsampled to its image, overlays, and the three-panel figure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F



def upsample(rollout: torch.Tensor, height: int, width: int) -> np.ndarray:
    """s×s rollout → H×W in [0, 1] (bilinear, then min-max scaled for display)."""
    heat = F.interpolate(rollout[None, None].float(), size=(height, width), mode="bilinear", align_corners=False)[0, 0]
    heat = heat - heat.min()
    return (heat / heat.max().clamp_min(1e-12)).numpy()


def overlay(image: torch.Tensor, heat: np.ndarray, cmap: str = "inferno", alpha: float = 0.5) -> np.ndarray:
    """uint8 3×H×W + H×W heat in [0, 1] → uint8 H×W×3 blend, coloured by a matplotlib colour map."""
    from matplotlib import colormaps

    coloured = colormaps[cmap](heat)[..., :3]
    blend = (1 - alpha) * image.permute(1, 2, 0).numpy() / 255.0 + alpha * coloured
    return (np.clip(blend, 0, 1) * 255).astype(np.uint8)


def save_figure(path: Path, image: torch.Tensor, heat: np.ndarray, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(9, 3.4))
    for ax, picture, name in zip(axes, (image.permute(1, 2, 0).numpy(), heat, overlay(image, heat)),
                                 ("input", "attention rollout", "overlay")):
        ax.imshow(picture, cmap="inferno" if picture.ndim == 2 else None)
        ax.set_title(name, fontsize=9)
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
