"""`vit-rollout` / `python scripts/rollout.py`: per image, a PNG of the input, the rollout heat map
upsampled to it, and their overlay, titled with the predicted class.

Exit status: 0 every image drawn, 1 some images failed (the others are still drawn), 2 the checkpoint
or the arguments are unusable.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vit.exits import ConfigError
from vit.failures import exit_on_failure
from vit.data.images import ImageError, find_images, load_image
from vit.inference.classifier import add_checkpoint_argument, load_classifier
from vit.models.rollout import HEAD_FUSIONS, explain
from vit.models.visualize import save_figure, upsample


def parse_args(argv):
    p = argparse.ArgumentParser(prog="vit-rollout", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_argument(p)
    p.add_argument("images", nargs="+", help="image files and/or directories")
    p.add_argument("--output-dir", required=True, type=Path)
    p.add_argument("--head-fusion", choices=HEAD_FUSIONS, default="mean")
    p.add_argument("--discard-ratio", type=float, default=0.0)
    p.add_argument("--method", choices=["rollout", "gradient"], default="rollout")
    p.add_argument("--class", dest="label", default=None, help="explain this class (default: the predicted one)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = p.parse_args(argv)
    if not 0.0 <= args.discard_ratio < 1.0:
        p.error("--discard-ratio must be in [0, 1)")
    return args


@exit_on_failure
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    clf = load_classifier(args.checkpoint).to(args.device)
    target = None
    if args.label is not None:
        if args.label not in clf.class_names:
            raise ConfigError(f"--class {args.label!r} is not one of {clf.class_names}")
        target = clf.class_names.index(args.label)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    failed = False
    for path in find_images(args.images):
        try:
            image = load_image(path)
        except ImageError as e:
            print(f"{path}: error: {e}", file=sys.stderr)
            failed = True
            continue
        x = clf.normalize(clf.preprocess(image)[None].to(args.device))
        probs, rollout = explain(clf.model, x, args.method, target, args.head_fusion, args.discard_ratio)
        shown = target if target is not None else int(probs[0].argmax())
        title = f"{clf.class_names[shown]} ({probs[0, shown].item():.2f})"
        if args.method == "gradient":
            title = f"why {title}?"
        out = args.output_dir / f"{path.stem}_rollout.png"
        save_figure(out, image, upsample(rollout[0].cpu(), *image.shape[-2:]), title)
        print(f"{path}: {title} -> {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
