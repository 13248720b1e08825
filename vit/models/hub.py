"""A trained model in the timm / Hugging Face Hub world, both ways: export to timm's Hub layout
(``config.json`` + ``model.safetensors`` in timm's key names + a model card), read such a folder back
(``local-dir:DIR``, ``hf-hub:USER/REPO``) without timm, and upload it with ``huggingface_hub``."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from vit.models.checkpoints import CheckpointError
from vit.exits import BadInput

PREFIXES = ("local-dir:", "hf-hub:")
TIMM_ARCHITECTURE = "vit_base_patch16_224"  # any timm ViT: model_args set every dimension


class HubError(BadInput):
    """An upload that cannot be made (no token); the message says what to do."""


def export_timm(classifier, output: Path, card: str) -> list[Path]:
    """Write ``output/`` in timm's Hub layout with timm's own ``save_for_hf``: ``timm.create_model(
    "local-dir:OUTPUT", pretrained=True)`` then rebuilds the model, its label names and preprocessing."""
    import timm
    from timm.models import save_for_hf

    from vit.models.model import timm_model_args, vit_state_dict_to_timm

    meta = classifier.meta
    c = meta.config
    model = timm.create_model(TIMM_ARCHITECTURE, pretrained=False, **timm_model_args(c))
    model.load_state_dict(vit_state_dict_to_timm(classifier.model.state_dict(), c.patch_size))
    # validation resizes to S×S (squash), no crop, antialiased bilinear: the same in timm's transform terms
    data_config = {"input_size": (c.in_channels, c.image_size, c.image_size), "interpolation": "bilinear",
                   "crop_pct": 1.0, "crop_mode": "squash", "mean": tuple(meta.mean), "std": tuple(meta.std)}
    save_for_hf(model, str(output), model_config={"label_names": list(meta.class_names),
                                                  "pretrained_cfg": {"tag": "vit"}},
                safe_serialization=True, data_config=data_config)
    (output / "README.md").write_text(card)
    return [output / "config.json", output / "model.safetensors", output / "README.md"]


def resolve(spec: str) -> Path:
    """``local-dir:DIR`` → DIR; ``hf-hub:USER/REPO`` → the local snapshot of its config and weights."""
    if spec.startswith("local-dir:"):
        return Path(spec.removeprefix("local-dir:"))
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(spec.removeprefix("hf-hub:"), allow_patterns=["config.json", "*.safetensors"]))
    except Exception as e:  # noqa: BLE001 - offline, unknown repo, no access: one line
        raise CheckpointError(f"{spec}: could not be fetched from the Hugging Face Hub "
                              f"({type(e).__name__}: {(str(e).splitlines() or [''])[0]})") from None


def load_timm_folder(spec: str):
    """A timm Hub folder of a plain ViT (ours exported, or any such timm model) → (model, Metadata), which
    vit.inference.load_classifier makes a Classifier."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from vit.models.model import VisionTransformer, timm_state_dict_to_vit, vit_config_from_timm
    from vit.models.preprocessing import Metadata

    folder = resolve(spec)
    try:
        cfg = json.loads((folder / "config.json").read_text())
        state = load_file(folder / "model.safetensors")
    except FileNotFoundError as e:
        raise CheckpointError(f"{spec}: not a timm model folder ({Path(e.filename).name} is missing)") from None
    except (json.JSONDecodeError, UnicodeDecodeError, SafetensorError, OSError) as e:
        raise CheckpointError(f"{spec}: unreadable ({type(e).__name__}: {e})") from None
    args, pretrained = cfg.get("model_args", {}), cfg.get("pretrained_cfg", {})
    if not str(cfg.get("architecture", "")).startswith("vit_") or args.get("class_token") is False \
            or args.get("global_pool", "token") != "token" or "reg_tokens" in args:
        raise CheckpointError(f"{spec}: not a plain ViT with a [cls] head ({cfg.get('architecture')})")
    try:
        config = vit_config_from_timm({**args, "num_classes": cfg.get("num_classes", args.get("num_classes"))})
        names = cfg.get("label_names") or [str(i) for i in range(config.num_classes)]
        meta = Metadata(config, list(names.values()) if isinstance(names, dict) else list(names),
                        tuple(pretrained.get("mean", (0.5,) * 3)), tuple(pretrained.get("std", (0.5,) * 3)))
        model = VisionTransformer(config)
        model.load_state_dict(timm_state_dict_to_vit(state))
    except (TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{spec}: incompatible: {' '.join(str(e).split())[:400]}") from None
    return model, meta


def measured_accuracy(run: Path | None) -> tuple[float, float] | None:
    """The last test top-1/top-5 logged in a run folder's metrics.csv."""
    path = run / "metrics.csv" if run else None
    if not path or not path.is_file():
        return None
    rows = [r for r in csv.DictReader(path.open()) if r.get("test/acc")]
    return (float(rows[-1]["test/acc"]), float(rows[-1]["test/acc5"])) if rows else None


def model_card(classifier, checkpoint: Path, hparams: dict, run: Path | None, repo: str | None) -> str:
    """README.md of the exported folder: what it is, how it was trained, what it measured, how to load it."""
    meta, c = classifier.meta, classifier.meta.config
    acc = measured_accuracy(run)
    measured = (f"**{100 * acc[0]:.2f} %** test top-1 ({100 * acc[1]:.2f} % top-5), as logged at the end of the "
                f"training run (`{run}/metrics.csv`)" if acc else "not measured (no test result in the run folder)")
    config = (run / "config.yaml") if run else None
    data = next((line.split(":", 1)[1].strip() for line in config.read_text().splitlines()
                 if line.strip().startswith("class_path: vit.data.")), None) if config and config.is_file() else None
    options = {f"{k}.{field}" if isinstance(v, dict) else k: value for k, v in hparams.items()
               if k not in ("arch", "mean", "std") and not k.startswith("_")
               for field, value in (v.items() if isinstance(v, dict) else [(None, v)])}
    recipe = ", ".join(f"{k} {v}" for k, v in options.items() if v not in (None, 0, 0.0, False, [], ()))
    name = f"hf-hub:{repo}" if repo else "local-dir:PATH"
    return f"""---
library_name: timm
tags: [image-classification, timm, vit]
license: mit
---
# Vision Transformer (ViT-{c.dim}/{c.patch_size}, {c.depth} blocks) — {c.num_classes} classes

A standard pre-norm ViT trained from the checkpoint `{checkpoint.name}` with the `vit` project.

- Architecture: {c.image_size}×{c.image_size} input, patch {c.patch_size}, D={c.dim}, L={c.depth}, \
H={c.heads}, MLP ratio {c.mlp_ratio}, [cls] head.
- Classes: {", ".join(meta.class_names)}.
- Preprocessing: resize to {c.image_size}×{c.image_size} (bilinear, no crop), \
(x/255 − mean) / std with mean {list(meta.mean)}, std {list(meta.std)}.
- Data: {data or "see the training run"}.
- Recipe: {recipe or "see the training run"}.
- Measured: {measured}.

## Use

```python
import timm, torch
model = timm.create_model("{name}", pretrained=True).eval()
config = timm.data.resolve_data_config({{}}, model=model)
transform = timm.data.create_transform(**config)
probabilities = model(transform(image).unsqueeze(0)).softmax(-1)   # image: a PIL image
```

or, with the `vit` package: `vit-classify --checkpoint {name} image.jpg`. To drop your own photos on it and see
where it looks, in a local web page: `vit-demo --checkpoint {name}` (`pip install 'vit-lightning[demo]'`).
"""


def push_to_hub(folder: Path, repo: str) -> str:
    """Upload ``folder`` to the model repository ``repo`` (created if absent); the token comes from the
    usual place (``HF_TOKEN`` or `hf auth login`)."""
    from huggingface_hub import HfApi, get_token

    if not get_token():
        raise HubError("no Hugging Face token: run `hf auth login` or set HF_TOKEN, then push again")
    api = HfApi()
    api.create_repo(repo, repo_type="model", exist_ok=True)
    api.upload_folder(folder_path=str(folder), repo_id=repo, repo_type="model",
                      commit_message="Upload a ViT trained with vit")
    return f"https://huggingface.co/{repo}"


def pretrained_normalization(source: str) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """(mean, std) the fine-tuning weights ``source`` were trained with, from their ``pretrained_cfg``: timm's
    table for a timm name (nothing downloaded), config.json for ``local-dir:``/``hf-hub:``; None for a bare
    weights file."""
    if source.startswith("local-dir:"):
        cfg = json.loads((Path(source.removeprefix("local-dir:")) / "config.json").read_text()).get("pretrained_cfg", {})
    elif source.startswith("hf-hub:"):
        from huggingface_hub import hf_hub_download

        cfg = json.loads(Path(hf_hub_download(source.removeprefix("hf-hub:"), "config.json")).read_text())
        cfg = cfg.get("pretrained_cfg", {})
    elif Path(source).suffix in (".pth", ".pt", ".bin", ".safetensors"):
        return None
    else:
        from timm.models import get_pretrained_cfg

        found = get_pretrained_cfg(source)
        cfg = found.to_dict() if found else {}
    return (tuple(cfg["mean"]), tuple(cfg["std"])) if "mean" in cfg and "std" in cfg else None
