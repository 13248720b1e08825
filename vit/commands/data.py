"""`make data` / `python -m vit.commands.data [--root DIR]`: CIFAR-10 into DIR/cifar-10-batches-py/ (default
data/, where training looks), fetched and checked where there is network (a cluster's login node), so that
jobs on nodes without network find it there.

The official archive is downloaded and its md5 checked (a partial or corrupt download is fetched again);
then every file is read back as training reads it. A complete folder is only read back.

Exit status: 0 the data is there and reads, 2 it could not be fetched or a file is malformed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vit.data import cifar
from vit.failures import exit_on_failure


@exit_on_failure
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path("data"),
                   help="the folder for cifar-10-batches-py/ (training's --data.root; default: data)")
    p.add_argument("--url", default=cifar.URL, help="where the archive is fetched from (a mirror of it)")
    p.add_argument("--md5", default=cifar.ARCHIVE_MD5, help="the archive's md5 (the official one's by default)")
    args = p.parse_args(argv)
    folder = args.root / cifar.FOLDER
    fetched = not cifar.is_complete(folder)
    if fetched:
        cifar.download(args.root, args.url, args.md5)
    classes = cifar.read_meta(folder / cifar.META_FILE)
    train = len(cifar.read_split(folder, cifar.TRAIN_FILES, len(classes))[1])
    test = len(cifar.read_split(folder, [cifar.TEST_FILE], len(classes))[1])
    how = f"downloaded from {args.url} (md5 {args.md5} checked)" if fetched else "already there"
    print(f"{folder}: {how}; {train:,} training and {test:,} test images of {len(classes)} classes read back")
    return 0


if __name__ == "__main__":
    sys.exit(main())
