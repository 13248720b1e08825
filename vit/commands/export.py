"""`vit-export` / `python scripts/export.py --checkpoint CKPT --output OUT [--format FORMAT]`.

  safetensors  OUT.safetensors + OUT.json (config, class names, mean/std): read by vit-classify
  onnx         OUT.onnx, one file: uint8 images in, logits out, normalisation inside, names in its metadata
  timm         OUT/ in timm's Hugging Face Hub layout (config.json, model.safetensors, README.md model
               card): timm.create_model("local-dir:OUT", pretrained=True); --push-to-hub USER/REPO uploads it

Exit status: 0 written, 2 the checkpoint is unusable, the upload cannot be made or ONNX's packages are missing
(make install EXTRAS=onnx).
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from vit.exits import MissingExtra
from vit.failures import exit_on_failure
from vit.inference.classifier import add_checkpoint_argument, load_classifier


@exit_on_failure
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vit-export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_argument(p)
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--format", choices=["safetensors", "onnx", "timm"], default=None,
                   help="default: from the output's suffix (.onnx → onnx, .safetensors → safetensors, "
                        "no suffix → timm)")
    p.add_argument("--push-to-hub", metavar="USER/REPO", help="with --format timm: upload the folder there")
    args = p.parse_args(argv)
    fmt = args.format or {".onnx": "onnx", ".safetensors": "safetensors"}.get(args.output.suffix, "timm")
    if args.push_to_hub and fmt != "timm":
        p.error("--push-to-hub uploads a timm folder: use --format timm")
    missing = [m for m in ("onnx", "onnxscript") if fmt == "onnx" and importlib.util.find_spec(m) is None]
    if missing:  # an optional part: refused before any work, in one line
        raise MissingExtra(f"the ONNX export needs {' and '.join(missing)}: make install EXTRAS=onnx "
                           "(or pip install 'vit-lightning[onnx]')")
    from vit.models import hub
    from vit.inference.export import export_onnx, export_safetensors

    classifier = load_classifier(args.checkpoint)
    if fmt == "timm":
        from vit.models.checkpoints import read_checkpoint
        from vit.cluster.runs import run_of

        path = Path(args.checkpoint)
        hparams = read_checkpoint(path).get("hyper_parameters", {}) if path.suffix == ".ckpt" else {}
        card = hub.model_card(classifier, path, hparams, run_of(path) if path.is_file() else None,
                              args.push_to_hub)
        args.output.mkdir(parents=True, exist_ok=True)
        written = hub.export_timm(classifier, args.output, card)
    else:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        written = (export_onnx if fmt == "onnx" else export_safetensors)(classifier, args.output)
    print("wrote " + ", ".join(map(str, written)))
    if args.push_to_hub:
        print(f"uploaded to {hub.push_to_hub(args.output, args.push_to_hub)}")
    return 0
