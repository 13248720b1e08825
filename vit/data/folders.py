"""Image folders as ``vit.data.ImageFolderDataModule`` reads them, made from Fashion-MNIST's files:
``OUT/train/<class>/<n>.png`` (60,000) and ``OUT/test/<class>/<n>.png`` (10,000), 28×28 grayscale, the
classes named as torchvision names them. A real dataset for the folder path, small enough for a CPU.

torchvision reads the four files (``ROOT/FashionMNIST/raw/*-ubyte``, where its ``download=True`` puts
them); ``download`` fetches them first."""

from __future__ import annotations

import shutil
from pathlib import Path

from vit.exits import DatasetError

FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def class_folder(name: str) -> str:
    """A class name as a folder name ('T-shirt/top' → 'T-shirt-top')."""
    return name.replace("/", "-")


def fashion_mnist_folders(root: Path, out: Path, download: bool = False) -> dict[str, int]:
    """Write the folders; returns the images written per split."""
    from PIL import Image
    from torchvision.datasets import FashionMNIST

    raw = Path(root) / "FashionMNIST" / "raw"
    missing = [name for name in FILES if not (raw / name).is_file()]
    if missing and not download:
        raise DatasetError(f"{raw} lacks {', '.join(missing)}: Fashion-MNIST's files (uncompressed), where "
                           f"torchvision's download puts them; pass --download to fetch them")
    if missing:  # torchvision would try every mirror, then raise with its traceback
        from vit.cluster.network import unreachable

        url = FashionMNIST.mirrors[0] + FashionMNIST.resources[0][0]
        why = unreachable(url, timeout=20)
        if why:
            raise DatasetError(f"cannot download Fashion-MNIST: {url} does not answer: {why}. Put its four "
                               f"files, uncompressed, in {raw}")
    if out.exists() and any(out.iterdir()):
        raise DatasetError(f"{out} is not empty: give a new folder")
    partial = out.with_name(out.name + ".partial")  # renamed to OUT when whole: never half a dataset there
    shutil.rmtree(partial, ignore_errors=True)
    written = {}
    for split, train in (("train", True), ("test", False)):
        dataset = FashionMNIST(str(root), train=train, download=download)
        folders = [partial / split / class_folder(name) for name in dataset.classes]
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
        for i, (image, label) in enumerate(zip(dataset.data.numpy(), dataset.targets.tolist())):
            Image.fromarray(image).save(folders[label] / f"{i:05d}.png")
        written[split] = len(dataset)
    if out.exists():
        out.rmdir()  # (empty)
    partial.rename(out)
    return written


def write_fake_raw(root: Path, per_class: int = 40, test_per_class: int = 10) -> Path:
    """Fashion-MNIST's four files in torchvision's layout, with generated images (a learnable task: each
    class a bright band at its own height), for tests and `make figures --quick`. Returns ROOT."""
    import struct

    import numpy as np

    raw = Path(root) / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", per_class), ("t10k", test_per_class)):
        labels = np.repeat(np.arange(10, dtype=np.uint8), n)
        images = rng.integers(0, 60, (len(labels), 28, 28), dtype=np.uint8)
        for i, label in enumerate(labels):
            images[i, 2 * label + 3: 2 * label + 7] = 220
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, len(labels), 28, 28)
                                                          + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, len(labels)) + labels.tobytes())
    return Path(root)
