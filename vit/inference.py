"""A trained model rebuilt from a checkpoint or an export, preprocessing images as validation does
(vit.preprocessing). Imports neither Lightning nor wandb, so the command line starts fast."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from vit.checkpoints import CheckpointError, read_checkpoint
from vit.model import VisionTransformer
from vit.preprocessing import Metadata, resize


class Classifier:
    """A VisionTransformer with the preprocessing and class names it was trained with."""

    def __init__(self, model: VisionTransformer, meta: Metadata):
        self.model = model.eval()
        self.meta = meta
        self.normalize = meta.normalize()

    @property
    def class_names(self) -> list[str]:
        return self.meta.class_names

    def to(self, device) -> "Classifier":
        self.model.to(device)
        self.normalize.to(device)
        return self

    def preprocess(self, image: torch.Tensor) -> torch.Tensor:
        """uint8 3×H×W of any size → uint8 3×S×S, as validation resizes."""
        return resize(image, self.meta.config.image_size)

    @torch.inference_mode()
    def probabilities(self, batch: torch.Tensor) -> torch.Tensor:
        """uint8 B×3×S×S (from ``preprocess``) → B×K class probabilities."""
        return self.model(self.normalize(batch.to(self.normalize.mean.device))).float().softmax(-1)


def add_checkpoint_argument(parser) -> None:
    """``--checkpoint``, as every command that reads a trained model takes it (see ``load_classifier``)."""
    parser.add_argument("--checkpoint", required=True, help="a training .ckpt, an exported .safetensors, or a "
                                                            "timm folder: local-dir:DIR or hf-hub:USER/REPO")


def _build(meta, state: dict, where: str) -> Classifier:
    try:
        meta = Metadata.from_dict(meta)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: {e}") from None
    model = VisionTransformer(meta.config)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        detail = " ".join(str(e).split())
        raise CheckpointError(f"{where}: incompatible: its weights and model config do not fit together "
                              f"({detail[:400]})") from None
    return Classifier(model, meta)


def load_classifier(path: str | Path) -> Classifier:
    """A Lightning checkpoint (.ckpt) of the training command, an export (.safetensors + .json), or a
    timm Hub folder of a ViT: ``local-dir:DIR`` or ``hf-hub:USER/REPO`` (vit.hub)."""
    if str(path).startswith(("local-dir:", "hf-hub:")):
        from vit.hub import load_timm_folder

        return Classifier(*load_timm_folder(str(path)))
    path = Path(path)
    if path.suffix == ".safetensors":
        return _load_export(path)
    ckpt = read_checkpoint(path)
    # the EMA's weights when the run kept one (vit.module: the evaluated model), else the model's
    prefix = "ema.module." if any(k.startswith("ema.module.") for k in ckpt["state_dict"]) else "model."
    state = {k.removeprefix(prefix): v for k, v in ckpt["state_dict"].items() if k.startswith(prefix)}
    return _build(ckpt.get("vit"), state, str(path))


def sidecar(path: Path) -> Path:
    return path.with_suffix(".json")


def _load_export(path: Path) -> Classifier:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    side = sidecar(path)
    try:
        meta = json.loads(side.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: its sidecar {side.name} (config, class names, mean/std) is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{side}: not valid JSON ({e})") from None
    try:
        state = load_file(path)
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None
    return _build(meta, state, str(path))
