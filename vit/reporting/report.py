"""Figures of a run, drawn with matplotlib into its folder at the end of fit and of test (and again by
`vit-report RUN_DIR`): learning curves from the run's metrics.csv, the test confusion matrix with
per-class accuracy, and test images with prediction, confidence and rollout overlay — the ones the
model gets most confidently wrong, and some it gets right."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch

CURVES, CONFUSION, EXAMPLES = "learning_curves.png", "confusion_matrix.png", "test_examples.png"


def read_metrics(path: Path) -> dict[str, list[tuple[float, float]]]:
    """metrics.csv → {key: [(x, value), ...]}: x is the epoch for epoch-level keys, the step for the learning
    rate; a step logged twice (a run resumed after a crash mid-epoch) keeps its last value."""
    series: dict[str, dict[float, float]] = {}
    for row in csv.DictReader(path.open()):
        for key, value in row.items():
            if key in ("epoch", "step") or not value:
                continue
            x = row["step"] if key.startswith("lr-") else row["epoch"]
            if x:
                series.setdefault(key, {})[float(x)] = float(value)
    return {k: sorted(v.items()) for k, v in series.items()}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def learning_curves(metrics: dict):
    """Loss and accuracy per epoch (train, val), learning rate per step: a matplotlib Figure."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, name in zip(axes[:2], ("loss", "acc")):
        for split, style in (("train", "-o"), ("val", "-s")):
            points = metrics.get(f"{split}/{name}", [])
            if points:
                ax.plot(*zip(*points), style, markersize=3, label=split)
        ax.set_xlabel("epoch")
        ax.set_title({"loss": "cross-entropy loss", "acc": "top-1 accuracy"}[name])
        ax.grid(alpha=0.3)
        ax.legend()
    lr = next((v for k, v in metrics.items() if k.startswith("lr-")), [])
    if lr:
        axes[2].plot(*zip(*lr))
    axes[2].set_xlabel("step")
    axes[2].set_title("learning rate")
    axes[2].grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def confusion_matrix(probs: torch.Tensor, labels: torch.Tensor, names: list[str], path: Path) -> Path:
    plt = _pyplot()
    k = len(names)
    counts = torch.bincount(labels * k + probs.argmax(-1), minlength=k * k).view(k, k).double()
    share = counts / counts.sum(1, keepdim=True).clamp_min(1)
    size = max(5.0, 0.55 * k + 2)
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    im = ax.imshow(share.numpy(), cmap="Blues", vmin=0, vmax=1)
    if k <= 20:
        for i in range(k):
            for j in range(k):
                ax.text(j, i, f"{int(counts[i, j])}", ha="center", va="center", fontsize=7,
                        color="white" if share[i, j] > 0.5 else "black")
    accuracy = share.diag()
    ax.set_yticks(range(k), [f"{n} ({100 * a:.1f} %)" for n, a in zip(names, accuracy.tolist())], fontsize=8)
    ax.set_xticks(range(k), names, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("true class (per-class accuracy)")
    ax.set_xlabel("predicted class")
    total = counts.diag().sum() / counts.sum()
    ax.set_title(f"test confusion matrix: top-1 {100 * total:.2f} % of {int(counts.sum())} images")
    fig.colorbar(im, ax=ax, fraction=0.046, label="share of the true class")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def pick_examples(probs: torch.Tensor, labels: torch.Tensor, wrong: int = 8, right: int = 4) -> list[int]:
    """The most confidently wrong test images, then the most confidently right ones."""
    confidence, predicted = probs.max(-1)
    is_wrong = predicted != labels
    order = torch.argsort(confidence, descending=True)
    return [i for i in order.tolist() if is_wrong[i]][:wrong] + [i for i in order.tolist() if not is_wrong[i]][:right]


def examples(images: torch.Tensor, probs: torch.Tensor, labels: torch.Tensor, rollouts: torch.Tensor,
             names: list[str], path: Path) -> Path:
    """A grid: each image with its rollout overlaid, titled prediction (confidence) / truth."""
    from vit.models.visualize import overlay, upsample

    plt = _pyplot()
    n = len(images)
    cols = 4
    rows = max(1, -(-n // cols))
    fig, axes = plt.subplots(rows, cols * 2, figsize=(cols * 2 * 1.6, rows * 1.9))
    axes = np.atleast_2d(axes)
    for ax in axes.flat:
        ax.axis("off")
    for i in range(n):
        r, c = divmod(i, cols)
        image, p, y = images[i], probs[i], int(labels[i])
        pred = int(p.argmax())
        heat = upsample(rollouts[i].cpu(), *image.shape[-2:])
        for ax, picture in zip(axes[r, 2 * c : 2 * c + 2], (image.permute(1, 2, 0).numpy(), overlay(image, heat))):
            ax.imshow(picture, interpolation="nearest")
        colour = "tab:green" if pred == y else "tab:red"
        axes[r, 2 * c].set_title(f"{names[pred]} ({p[pred]:.2f})", fontsize=8, color=colour, loc="left")
        axes[r, 2 * c + 1].set_title(f"true: {names[y]}", fontsize=8, loc="left")
    fig.suptitle("test images: most confidently wrong (red), then right (green); image | attention rollout",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(run_dir: Path, module, test_set) -> list[Path]:
    """Every figure into ``run_dir``, from its metrics.csv and ``module``'s last test predictions."""
    from vit.models.rollout import explain

    written = []
    if (run_dir / "metrics.csv").is_file():
        written.append(_save(learning_curves(read_metrics(run_dir / "metrics.csv")), run_dir / CURVES))
    outputs = getattr(module, "test_predictions", None)
    if outputs:
        probs, labels = (torch.cat(x) for x in zip(*outputs))
        names = module.class_names
        written.append(confusion_matrix(probs, labels, names, run_dir / CONFUSION))
        chosen = pick_examples(probs, labels)
        images = torch.stack([test_set[i][0] for i in chosen])
        with torch.inference_mode(False):
            _, rollouts = explain(module.eval_model, module.normalize(images.to(module.device)))
        written.append(examples(images, probs[chosen], labels[chosen], rollouts, names, run_dir / EXAMPLES))
    return written


def publish(run_dir: Path, module, test_set, loggers) -> list[Path]:
    """The run's figures into its folder (``write``), and to W&B when the run logs there."""
    from vit.training.loggers import wandb_logger

    figures = write(run_dir, module, test_set)
    wandb = wandb_logger(loggers)
    for figure in figures if wandb is not None else []:
        wandb.log_image(key=f"report/{figure.stem}", images=[str(figure)])
    return figures
