"""`vit-classify` / `python scripts/classify.py`: top-k classes of image files, from a checkpoint alone.

Exit status: 0 every image classified, 1 some images failed (the others are still reported),
2 the checkpoint or the arguments are unusable.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from vit.images import ImageError, find_images, load_image
from vit.checkpoints import CheckpointError
from vit.inference import load_classifier


def parse_args(argv):
    p = argparse.ArgumentParser(prog="vit-classify", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="training .ckpt, or an exported .safetensors")
    p.add_argument("images", nargs="+", help="image files and/or directories (walked for images)")
    p.add_argument("--top-k", type=int, default=3)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args(argv)
    if args.top_k < 1 or args.batch_size < 1:
        p.error("--top-k and --batch-size must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    if device == "auto":
        device = "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda, but no CUDA device is available", file=sys.stderr)
        return 2
    try:
        clf = load_classifier(args.checkpoint).to(device)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    k = min(args.top_k, len(clf.class_names))
    results, pending = [], []  # pending: (index in results, preprocessed image)

    def flush():
        if not pending:
            return
        probs = clf.probabilities(torch.stack([img for _, img in pending]))
        top_p, top_i = probs.topk(k, dim=-1)
        for (slot, _), ps, idx in zip(pending, top_p.tolist(), top_i.tolist()):
            results[slot]["predictions"] = [{"label": clf.class_names[i], "probability": round(p, 4)}
                                            for p, i in zip(ps, idx)]
        pending.clear()

    for path in find_images(args.images):
        results.append({"image": str(path)})
        try:
            pending.append((len(results) - 1, clf.preprocess(load_image(path))))
        except ImageError as e:
            results[-1]["error"] = str(e)
            if not args.json:
                print(f"{path}: error: {e}", file=sys.stderr)
        if len(pending) >= args.batch_size:
            flush()
    flush()

    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            if "predictions" in r:
                print(f"{r['image']}: " + " , ".join(f"{p['label']} ({p['probability']:.3f})" for p in r["predictions"]))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
