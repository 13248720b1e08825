"""Export a checkpoint: `python scripts/export.py --checkpoint CKPT --output model.safetensors [--format onnx]`.

Writes the weights (safetensors) or an ONNX graph, plus a JSON sidecar (config, class names, mean/std).
"""

import argparse
import sys
from pathlib import Path

from vit.inference import CheckpointError, export_onnx, export_safetensors, load_classifier


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--format", choices=["safetensors", "onnx"], default=None,
                   help="default: from the output's suffix (.onnx → onnx, else safetensors)")
    args = p.parse_args()
    fmt = args.format or ("onnx" if args.output.suffix == ".onnx" else "safetensors")
    try:
        classifier = load_classifier(args.checkpoint)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.output.parent.mkdir(parents=True, exist_ok=True)
    written = (export_onnx if fmt == "onnx" else export_safetensors)(classifier, args.output)
    print("wrote " + ", ".join(map(str, written)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
