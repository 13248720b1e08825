"""`vit-classify` / `python scripts/classify.py`: top-k classes of image files, from a checkpoint alone.

Images are decoded and resized in DataLoader workers and classified in batches; results keep the input
order. A progress bar shows on stderr for more than a screenful of images.

Exit status: 0 every image classified, 1 some images failed (the others are still reported),
2 the checkpoint or the arguments are unusable.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path

import torch

from vit.exits import ConfigError
from vit.failures import exit_on_failure
from vit.data.images import find_images
from vit.inference.classifier import add_checkpoint_argument, classify_files, load_classifier

SCREENFUL = 40


def parse_args(argv):
    p = argparse.ArgumentParser(prog="vit-classify", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_argument(p)
    p.add_argument("images", nargs="+", help="image files and/or directories (walked for images)")
    p.add_argument("--top-k", type=int, default=3)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--output", type=Path, help="also write the results to FILE.csv or FILE.json")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--tta-flip", action="store_true",
                   help="average each image's and its mirror image's logits (test-time augmentation: twice the "
                        "work per image)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="processes that decode and resize images (default: the CPU count; 0: this process)")
    args = p.parse_args(argv)
    if args.top_k < 1 or args.batch_size < 1 or args.workers < 0:
        p.error("--top-k and --batch-size must be positive, --workers non-negative")
    if args.output and args.output.suffix not in (".csv", ".json"):
        p.error("--output must end in .csv or .json")
    return args


def write_output(path: Path, results: list[dict], k: int) -> None:
    if path.suffix == ".json":
        path.write_text(json.dumps(results, indent=2))
        return
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", *[f"{w}_{j}" for j in range(1, k + 1) for w in ("label", "probability")], "error"])
        for r in results:
            preds = [v for p in r.get("predictions", []) for v in (p["label"], p["probability"])]
            writer.writerow([r["image"], *preds, *[""] * (2 * k - len(preds)), r.get("error", "")])


@exit_on_failure
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    if device == "auto":
        device = "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda, but no CUDA device is available")
    clf = load_classifier(args.checkpoint).to(device)
    k = min(args.top_k, len(clf.class_names))
    paths = find_images(args.images)
    workers = args.workers if len(paths) > args.batch_size else 0  # a few images: no processes to start
    from tqdm import tqdm

    with tqdm(total=len(paths), unit="img", disable=len(paths) <= SCREENFUL, file=sys.stderr) as bar:
        def progress(done: int, errors: list[tuple[int, str]]) -> None:
            for i, error in errors if not args.json else []:
                bar.write(f"{paths[i]}: error: {error}", file=sys.stderr)
            bar.update(done)

        results = classify_files(clf, paths, k, args.batch_size, workers, progress, args.tta_flip)

    if args.json:
        print(json.dumps(results, indent=2))
    elif not args.output:
        for r in results:
            if "predictions" in r:
                print(f"{r['image']}: " + " , ".join(f"{p['label']} ({p['probability']:.3f})" for p in r["predictions"]))
    if args.output:
        write_output(args.output, results, k)
        failed = sum("error" in r for r in results)
        print(f"wrote {len(results)} results ({failed} errors) to {args.output}", file=sys.stderr)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
