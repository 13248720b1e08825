"""What the demo page (`vit-demo`) shows for each image, on the code paths classify and rollout use: one loader
(vit.data.images), one preprocessing (vit.inference.Classifier.preprocess), the probabilities classify prints
(``Classifier.probabilities``) and one rollout (vit.models.rollout.explain). No Gradio here: the page is
vit/commands/demo.py."""

from __future__ import annotations

import base64
import html
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from vit.data.images import ImageError, load_image
from vit.inference.classifier import Classifier
from vit.models.rollout import explain
from vit.models.visualize import overlay, upsample

MAX_IMAGES = 20  # per request: more are named and left out, so that one drop never stalls the page
MAX_SIDE = 1024  # the overlay at the original size is drawn at most this many pixels on its long side
PREDICTED = "(the predicted class)"
CARD = "display:flex;gap:16px;align-items:flex-start;flex-wrap:wrap;padding:8px 0;border-bottom:1px solid #ddd"


@dataclass
class Analysis:
    """One image's result: its top classes and the two overlays, or why it could not be read."""

    name: str
    error: str | None = None
    top: list[tuple[str, float]] = field(default_factory=list)
    explained: str | None = None
    at_input: np.ndarray | None = None  # H×W×3 uint8, the model's input size
    at_original: np.ndarray | None = None  # the original size, long side at most MAX_SIDE


def analyse(clf: Classifier, path: str | Path, head_fusion: str = "mean", discard_ratio: float = 0.0,
            method: str = "rollout", label: str | None = None, top_k: int = 5) -> Analysis:
    name = Path(path).name
    try:
        image = load_image(path)
    except ImageError as e:
        return Analysis(name, error=str(e).replace(str(path), name))  # (an upload's path is the server's)
    small = clf.preprocess(image)
    probs = clf.probabilities(small[None])[0].cpu()  # exactly what vit-classify prints
    k = min(top_k, len(clf.class_names))
    top_p, top_i = probs.topk(k)
    target = clf.class_names.index(label) if label and label != PREDICTED else None
    x = clf.normalize(small[None].to(clf.normalize.mean.device))
    _, rollout = explain(clf.model, x, method, target, head_fusion, discard_ratio)
    rollout = rollout[0].cpu()
    h, w = image.shape[-2:]
    scale = min(1.0, MAX_SIDE / max(h, w))
    shown = image if scale == 1.0 else resize_keeping_aspect(image, round(h * scale), round(w * scale))
    explained = clf.class_names[target if target is not None else int(probs.argmax())]
    return Analysis(name, top=[(clf.class_names[i], round(p, 4)) for p, i in zip(top_p.tolist(), top_i.tolist())],
                    explained=explained,
                    at_input=overlay(small, upsample(rollout, *small.shape[-2:])),
                    at_original=overlay(shown, upsample(rollout, *shown.shape[-2:])))


def resize_keeping_aspect(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    from torchvision.transforms.v2 import functional as F

    return F.resize(image, [height, width], antialias=True)


def png_data_url(picture: np.ndarray) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(picture).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def render(results: list[Analysis], left_out: int = 0) -> str:
    """The page's results: one block per image (classes for tests and screen readers: vit-result, vit-class,
    vit-prob, vit-error), the overlays inline as PNG data (nothing fetched from elsewhere)."""
    blocks = []
    for r in results:
        name = html.escape(r.name)
        if r.error is not None:
            blocks.append(f'<div class="vit-result vit-error" data-name="{name}" style="{CARD}"><div><b>{name}</b>'
                          f'<p class="vit-message" style="color:#b91c1c">cannot be read: {html.escape(r.error)}</p>'
                          f'</div></div>')
            continue
        rows = "".join(f'<li><span class="vit-class">{html.escape(c)}</span> '
                       f'<span class="vit-prob">{p:.4f}</span></li>' for c, p in r.top)
        blocks.append(
            f'<div class="vit-result" data-name="{name}" style="{CARD}">'
            f'<div style="min-width:180px"><b>{name}</b><ol class="vit-top" style="margin:6px 0">{rows}</ol>'
            f'<small>where it looks for <b class="vit-explained">{html.escape(r.explained)}</b></small></div>'
            f'<figure style="margin:0"><img class="vit-overlay-input" alt="rollout at the input size" '
            f'src="{png_data_url(r.at_input)}" style="width:160px;image-rendering:pixelated">'
            f'<figcaption><small>at the model\'s input size</small></figcaption></figure>'
            f'<figure style="margin:0"><img class="vit-overlay-original" alt="rollout at the original size" '
            f'src="{png_data_url(r.at_original)}" style="max-width:420px;max-height:320px">'
            f'<figcaption><small>at the original size</small></figcaption></figure></div>')
    if left_out:
        blocks.append(f'<p class="vit-left-out">{left_out} more image(s) left out: at most {MAX_IMAGES} per drop.</p>')
    return "\n".join(blocks)


def recorded_top1(checkpoint: str) -> float | None:
    """The test top-1 the training run recorded: the run folder's results.json beside a .ckpt, or the model
    card of an exported folder."""
    from vit.models import hub

    if checkpoint.startswith("local-dir:"):
        card = Path(checkpoint.removeprefix("local-dir:")) / "README.md"
        found = re.search(r"\*\*([\d.]+) %\*\* test top-1", card.read_text()) if card.is_file() else None
        return float(found.group(1)) if found else None
    path = Path(checkpoint)
    run = path.resolve().parent.parent if path.resolve().parent.name == "checkpoints" else None
    record = run / "results.json" if run else None
    if record and record.is_file():
        return json.loads(record.read_text()).get("test_top1")
    measured = hub.measured_accuracy(run)
    return round(100 * measured[0], 2) if measured else None


def model_card(clf: Classifier, checkpoint: str) -> str:
    """Markdown: architecture, classes, preprocessing, and the recorded test top-1."""
    c, meta = clf.meta.config, clf.meta
    top1 = recorded_top1(checkpoint)
    return (f"### ViT-{c.dim}/{c.patch_size}, {c.depth} blocks, {c.heads} heads — `{checkpoint}`\n"
            f"- **Classes** ({len(meta.class_names)}): {', '.join(meta.class_names)}\n"
            f"- **Preprocessing**: resized to {c.image_size}×{c.image_size} (bilinear, no crop), "
            f"(x/255 − mean) / std, mean {[round(m, 4) for m in meta.mean]}, std {[round(s, 4) for s in meta.std]}\n"
            f"- **Test top-1 recorded by its run**: " + (f"{top1:.2f} %" if top1 is not None else "not recorded") + "\n"
            f"- Up to {MAX_IMAGES} images per drop; the overlay at the original size is drawn at most {MAX_SIDE} px "
            f"on its long side.")
