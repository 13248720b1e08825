"""`python scripts/rollout.py`: per image, a PNG of the input, the rollout heat map upsampled to it,
and their overlay, titled with the predicted class. Exit status as for classify (0 / 1 / 2)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vit.images import ImageError, find_images, load_image
from vit.inference import CheckpointError, load_classifier
from vit.rollout import HEAD_FUSIONS, explain


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


def parse_args(argv):
    p = argparse.ArgumentParser(prog="rollout", description=__doc__)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("images", nargs="+", help="image files and/or directories")
    p.add_argument("--output-dir", required=True, type=Path)
    p.add_argument("--head-fusion", choices=HEAD_FUSIONS, default="mean")
    p.add_argument("--discard-ratio", type=float, default=0.0)
    p.add_argument("--method", choices=["rollout", "gradient"], default="rollout")
    p.add_argument("--class", dest="label", default=None, help="explain this class (default: the predicted one)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = p.parse_args(argv)
    if not 0.0 <= args.discard_ratio < 1.0:
        p.error("--discard-ratio must be in [0, 1)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        clf = load_classifier(args.checkpoint).to(args.device)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    target = None
    if args.label is not None:
        if args.label not in clf.class_names:
            print(f"error: --class {args.label!r} is not one of {clf.class_names}", file=sys.stderr)
            return 2
        target = clf.class_names.index(args.label)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    failed = False
    for path in find_images(args.images):
        try:
            image = load_image(path)
        except ImageError as e:
            print(f"{path}: error: {e}", file=sys.stderr)
            failed = True
            continue
        x = clf.normalize(clf.preprocess(image)[None].to(args.device))
        probs, rollout = explain(clf.model, x, args.method, target, args.head_fusion, args.discard_ratio)
        shown = target if target is not None else int(probs[0].argmax())
        title = f"{clf.class_names[shown]} ({probs[0, shown].item():.2f})"
        if args.method == "gradient":
            title = f"why {title}?"
        out = args.output_dir / f"{path.stem}_rollout.png"
        save_figure(out, image, upsample(rollout[0].cpu(), *image.shape[-2:]), title)
        print(f"{path}: {title} -> {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
