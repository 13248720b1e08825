"""Rebuild a trained model from a checkpoint or an exported file, and preprocess images as validation
does. Imports neither Lightning nor wandb, so the command line starts fast."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch
from torchvision.transforms.v2 import functional as TF

from vit.model import ViTConfig, VisionTransformer


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, corrupt, unsafe or not one of ours; the message says which."""


class Classifier:
    """A VisionTransformer with the preprocessing and class names it was trained with."""

    def __init__(self, model: VisionTransformer, class_names: list[str], mean, std):
        self.model = model.eval()
        self.class_names = list(class_names)
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)

    @property
    def image_size(self) -> int:
        return self.model.config.image_size

    def to(self, device) -> "Classifier":
        self.model.to(device)
        self.mean, self.std = self.mean.to(device), self.std.to(device)
        return self

    def preprocess(self, image: torch.Tensor) -> torch.Tensor:
        """uint8 3×H×W of any size → uint8 3×S×S, as validation resizes (antialiased bilinear)."""
        s = self.image_size
        return image if image.shape[-2:] == (s, s) else TF.resize(image, [s, s], antialias=True)

    def normalize(self, batch: torch.Tensor) -> torch.Tensor:
        return (batch.float() / 255 - self.mean) / self.std

    @torch.inference_mode()
    def probabilities(self, batch: torch.Tensor) -> torch.Tensor:
        """uint8 B×3×S×S (from ``preprocess``) → B×K class probabilities."""
        return self.model(self.normalize(batch.to(self.mean.device))).float().softmax(-1)

    def metadata(self) -> dict:
        from dataclasses import asdict

        return {"config": asdict(self.model.config), "class_names": self.class_names,
                "mean": self.mean.flatten().tolist(), "std": self.std.flatten().tolist()}


def _check_meta(meta, where: str) -> dict:
    if not isinstance(meta, dict) or not {"config", "class_names", "mean", "std"} <= set(meta):
        raise CheckpointError(f"{where}: not a vit checkpoint (no model config, class names and mean/std)")
    return meta


def _build(meta: dict, state: dict, where: str) -> Classifier:
    try:
        config = ViTConfig(**meta["config"])
        model = VisionTransformer.from_config(config)
        model.load_state_dict(state)
    except (TypeError, ValueError, RuntimeError) as e:
        detail = " ".join(str(e).split())
        raise CheckpointError(f"{where}: incompatible: its weights and model config do not fit together "
                              f"({detail[:400]})") from None
    if len(meta["class_names"]) != config.num_classes:
        raise CheckpointError(f"{where}: {len(meta['class_names'])} class names for {config.num_classes} classes")
    return Classifier(model, meta["class_names"], meta["mean"], meta["std"])


def load_classifier(path: str | Path) -> Classifier:
    """A Lightning checkpoint (.ckpt) of ``scripts/train.py``, or an export (``.safetensors`` + ``.json``).

    Checkpoints are read with ``torch.load(weights_only=True)``: a crafted pickle cannot run code.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    if path.suffix == ".safetensors":
        return _load_export(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "global" not in str(e).lower():  # not a code reference: just bytes that are no checkpoint
            raise CheckpointError(f"{path}: not a readable checkpoint (corrupt pickle data)") from None
        detail = next((line.strip() for line in str(e).splitlines() if "global" in line.lower()), "")
        raise CheckpointError(f"{path}: refused, the checkpoint references code, not only weights and "
                              f"plain data ({detail})") from None
    except Exception as e:  # noqa: BLE001 - a corrupt file can fail anywhere in torch.load
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(e).__name__}: "
                              f"{(str(e).splitlines() or [''])[0]})") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        raise CheckpointError(f"{path}: not a vit training checkpoint (no state_dict)")
    meta = _check_meta(ckpt.get("vit"), str(path))
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    return _build(meta, state, str(path))


def sidecar(path: Path) -> Path:
    return path.with_suffix(".json")


def _load_export(path: Path) -> Classifier:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

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
    return _build(_check_meta(meta, str(side)), state, str(path))


def export_safetensors(classifier: Classifier, output: Path) -> list[Path]:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in classifier.model.state_dict().items()}, output)
    sidecar(output).write_text(json.dumps(classifier.metadata(), indent=2))
    return [output, sidecar(output)]


def export_onnx(classifier: Classifier, output: Path) -> list[Path]:
    """ONNX graph of the network: input ``images`` = normalised float B×C×S×S, output ``logits``."""
    c = classifier.model.config
    example = torch.randn(2, c.in_channels, c.image_size, c.image_size)
    torch.onnx.export(classifier.model.cpu(), (example,), str(output), input_names=["images"],
                      output_names=["logits"], dynamic_shapes={"images": {0: torch.export.Dim("batch")}},
                      dynamo=True, verbose=False)
    sidecar(output).write_text(json.dumps(classifier.metadata(), indent=2))
    return [output, sidecar(output)]
