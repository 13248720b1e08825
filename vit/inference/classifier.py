"""A trained model rebuilt from a checkpoint or an export, preprocessing images as validation does
(vit.models.preprocessing). Imports neither Lightning nor wandb, so the command line starts fast."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from torch.utils.data import DataLoader, Dataset

from vit.models.checkpoints import CheckpointError, read_checkpoint
from vit.data.images import ImageError, load_image
from vit.models.model import VisionTransformer
from vit.models.preprocessing import Metadata, resize


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
    def probabilities(self, batch: torch.Tensor, tta_flip: bool = False) -> torch.Tensor:
        """uint8 B×3×S×S (from ``preprocess``) → B×K class probabilities; with ``tta_flip``, from the mean of
        each image's and its mirror image's logits."""
        x = self.normalize(batch.to(self.normalize.mean.device))
        logits = (self.model(x) + self.model(x.flip(-1))) / 2 if tta_flip else self.model(x)
        return logits.float().softmax(-1)


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
    timm Hub folder of a ViT: ``local-dir:DIR`` or ``hf-hub:USER/REPO`` (vit.models.hub)."""
    if str(path).startswith(("local-dir:", "hf-hub:")):
        from vit.models.hub import load_timm_folder

        return Classifier(*load_timm_folder(str(path)))
    path = Path(path)
    if path.suffix == ".safetensors":
        return _load_export(path)
    ckpt = read_checkpoint(path)
    # the EMA's weights when the run kept one (vit.training.module: the evaluated model), else the model's
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


class ImageFiles(Dataset):
    """(index, uint8 3×S×S image or None, error) per file: a bad file is an entry, never an exception."""

    def __init__(self, paths: list[Path], size: int):
        self.paths, self.size = paths, size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i):
        try:
            return i, resize(load_image(self.paths[i]), self.size), None
        except ImageError as e:
            return i, None, str(e)


def _collate(samples):
    good = [(i, image) for i, image, _ in samples if image is not None]
    return ([i for i, _ in good], torch.stack([image for _, image in good]) if good else None,
            [(i, error) for i, image, error in samples if image is None])


def classify_files(clf: Classifier, paths: list[Path], top_k: int, batch_size: int = 64, workers: int = 0,
                   progress=None, tta_flip: bool = False) -> list[dict]:
    """Per file, in the input order: ``{"image": path, "predictions": [{"label", "probability"}, ...]}`` (the
    top ``top_k``, probabilities rounded to 4 places), or ``{"image": path, "error": why}`` for a file that
    cannot be read. Files are decoded and resized in ``workers`` DataLoader processes (0: this one) and
    classified in batches; with a worker on every core the model keeps one thread (restored after), so that
    they do not fight. ``progress(done, errors)`` is called after each batch; ``tta_flip``: see probabilities."""
    import os

    results = [{"image": str(p)} for p in paths]
    threads = torch.get_num_threads()
    if workers >= (os.cpu_count() or 1):
        torch.set_num_threads(1)
    try:
        loader = DataLoader(ImageFiles(paths, clf.meta.config.image_size), batch_size=batch_size,
                            num_workers=workers, collate_fn=_collate)
        for indices, images, errors in loader:
            for i, error in errors:
                results[i]["error"] = error
            if images is not None:
                top_p, top_i = clf.probabilities(images, tta_flip).topk(top_k, dim=-1)
                for i, ps, idx in zip(indices, top_p.tolist(), top_i.tolist()):
                    results[i]["predictions"] = [{"label": clf.class_names[c], "probability": round(p, 4)}
                                                 for p, c in zip(ps, idx)]
            if progress is not None:
                progress(len(indices) + len(errors), errors)
    finally:
        torch.set_num_threads(threads)
    return results
