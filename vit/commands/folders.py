"""`vit-folders` / `python scripts/folders.py --root ROOT --out OUT [--download]`: Fashion-MNIST as image
folders (OUT/train/<class>/, OUT/test/<class>/), for `--data vit.data.ImageFolderDataModule --data.root OUT`.

Exit status: 0 written, 2 the files are missing (without --download) or OUT is not empty.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vit.failures import exit_on_failure


@exit_on_failure
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vit-folders", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, required=True,
                   help="holds FashionMNIST/raw/ with its four *-ubyte files (torchvision's layout)")
    p.add_argument("--out", type=Path, required=True, help="a new or empty folder")
    p.add_argument("--download", action="store_true", help="fetch the files into ROOT first (torchvision)")
    args = p.parse_args(argv)
    from vit.data.folders import fashion_mnist_folders

    written = fashion_mnist_folders(args.root, args.out, args.download)
    print(f"wrote {args.out}: " + ", ".join(f"{split}/ {n:,} images" for split, n in written.items()))
    return 0
