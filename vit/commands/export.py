"""`vit-export` / `python scripts/export.py --checkpoint CKPT --output model.safetensors [--format onnx]`.

Writes the weights (safetensors) or an ONNX graph, plus a JSON sidecar (config, class names, mean/std).
Exit status: 0 written, 2 the checkpoint is unusable.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vit.checkpoints import CheckpointError
from vit.inference import load_classifier


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vit-export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="training .ckpt, or an exported .safetensors")
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--format", choices=["safetensors", "onnx"], default=None,
                   help="default: from the output's suffix (.onnx → onnx, else safetensors)")
    args = p.parse_args(argv)
    fmt = args.format or ("onnx" if args.output.suffix == ".onnx" else "safetensors")
    try:
        classifier = load_classifier(args.checkpoint)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from vit.export import export_onnx, export_safetensors

    args.output.parent.mkdir(parents=True, exist_ok=True)
    written = (export_onnx if fmt == "onnx" else export_safetensors)(classifier, args.output)
    print("wrote " + ", ".join(map(str, written)))
    return 0
