"""CIFAR-10's official python format: a safe reader that validates structure (not md5s, so that a
re-assembled copy is accepted), and the md5-checked download of the official archive."""

from __future__ import annotations

import pickle
import tarfile
import urllib.error
from pathlib import Path

import numpy as np
import torch

from vit.exits import DatasetError

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
ARCHIVE_MD5 = "c58f30108f718f92721af3b95e74349a"
FOLDER = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
META_FILE = "batches.meta"
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


__all__ = ["DatasetError"]  # (vit.exits: the project's error types)


_ALLOWED_GLOBALS = {  # all a CIFAR batch pickle may reference: numpy arrays of plain dtypes, and
    ("_codecs", "encode"),  # the str → bytes call Python 3 writes for bytes in protocol 2
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"forbidden global {module}.{name}")


def _load_pickle(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            obj = _RestrictedUnpickler(f, encoding="bytes").load()
    except FileNotFoundError:
        raise DatasetError(f"{path}: file is missing") from None
    except Exception as e:  # noqa: BLE001 - any unpickling failure is a malformed file
        raise DatasetError(f"{path}: not a valid CIFAR batch file ({type(e).__name__}: {e})") from None
    if not isinstance(obj, dict):
        raise DatasetError(f"{path}: expected a pickled dict, got {type(obj).__name__}")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in obj.items()}


def read_meta(path: Path) -> list[str]:
    """batches.meta → the class names."""
    names = _load_pickle(path).get("label_names")
    if not isinstance(names, list) or not names or not all(isinstance(n, (bytes, str)) for n in names):
        raise DatasetError(f"{path}: 'label_names' must be a non-empty list of strings")
    return [n.decode() if isinstance(n, bytes) else n for n in names]


def read_batch(path: Path, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One official batch file → (uint8 N×3×32×32, int64 N), validated."""
    batch = _load_pickle(path)
    data, labels = batch.get("data"), batch.get("labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        shape = getattr(data, "shape", None)
        raise DatasetError(f"{path}: 'data' must be a uint8 array N×3072, got {type(data).__name__} {shape}")
    if not isinstance(labels, list) or len(labels) != len(data):
        raise DatasetError(f"{path}: 'labels' must be a list of {len(data)} integers")
    labels_t = torch.tensor(labels, dtype=torch.int64) if labels else torch.zeros(0, dtype=torch.int64)
    if len(labels_t) and (labels_t.min() < 0 or labels_t.max() >= num_classes):
        raise DatasetError(f"{path}: labels must lie in [0, {num_classes}), "
                           f"found [{labels_t.min().item()}, {labels_t.max().item()}]")
    images = torch.from_numpy(data.copy()).view(-1, 3, 32, 32)  # rows are R, G, B planes of 32×32
    return images, labels_t


def read_split(folder: Path, files, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    parts = [read_batch(folder / f, num_classes) for f in files]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def is_complete(folder: Path) -> bool:
    return all((folder / f).is_file() for f in (*TRAIN_FILES, TEST_FILE, META_FILE))


def download(root: Path, url: str = URL, md5: str = ARCHIVE_MD5) -> None:
    """Fetch and extract the official archive into ``root`` (torchvision re-fetches an archive whose
    md5 is wrong: a partial or corrupt download)."""
    from torchvision.datasets.utils import download_and_extract_archive

    folder = root / FOLDER
    try:
        download_and_extract_archive(url, str(root), md5=md5)
    except (urllib.error.URLError, OSError, RuntimeError, tarfile.TarError) as e:
        raise DatasetError(
            f"CIFAR-10 is not in {folder} and could not be downloaded from {url} ({e}). "
            f"Download and extract cifar-10-python.tar.gz yourself so that {folder} holds "
            f"data_batch_1..5, test_batch and batches.meta, or pass --data.root DIR for a DIR that "
            f"contains {FOLDER}/."
        ) from None
    if not is_complete(folder):
        raise DatasetError(f"the downloaded archive did not contain {folder} with all batch files")


def write_fake(root: Path, per_batch: int = 100, test_size: int = 200, seed: int = 0) -> Path:
    """Write ``root/cifar-10-batches-py/`` with 5 × ``per_batch`` training and ``test_size`` test images: a
    learnable task (each class has its own colour, plus pixel noise), pickled exactly like the official files
    (dicts of bytes keys). The one writer of fake CIFAR-10: the tests, `make figures --quick` and the
    benchmark's data section use it. Returns ``root``."""
    rng = np.random.default_rng(seed)
    colours = rng.integers(30, 226, size=(10, 3))
    folder = Path(root) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    for i, (name, n) in enumerate([*((f, per_batch) for f in TRAIN_FILES), (TEST_FILE, test_size)]):
        labels = rng.integers(0, 10, size=n)
        images = np.clip(colours[labels][:, :, None, None] + rng.normal(0, 30, size=(n, 3, 32, 32)), 0, 255)
        title = f"training batch {i + 1} of 5" if name != TEST_FILE else "testing batch 1 of 1"
        with open(folder / name, "wb") as f:
            _Python2Pickler(f, protocol=2).dump({
                b"batch_label": title.encode(), b"labels": labels.tolist(),
                b"data": images.astype(np.uint8).reshape(n, 3072),
                b"filenames": [f"{title}_{j:05d}.png".encode() for j in range(n)]})
    with open(folder / META_FILE, "wb") as f:
        _Python2Pickler(f, protocol=2).dump({b"label_names": [c.encode() for c in CLASSES],
                                             b"num_cases_per_batch": per_batch, b"num_vis": 3072})
    return Path(root)


class _Python2Pickler(pickle._Pickler):
    """Bytes as Python 2's ``str`` (SHORT_BINSTRING/BINSTRING), as the official files were pickled: they load
    as bytes with ``encoding="bytes"`` (our reader) and as str with ``encoding="latin1"`` (torchvision's)."""

    dispatch = pickle._Pickler.dispatch.copy()

    def _save_bytes(self, obj: bytes) -> None:
        n = len(obj)
        self.write(pickle.SHORT_BINSTRING + bytes([n]) + obj if n < 256 else
                   pickle.BINSTRING + n.to_bytes(4, "little") + obj)
        self.memoize(obj)

    dispatch[bytes] = _save_bytes
