"""Data: CIFAR-10 in its official python format, and class-per-folder images.

The pipeline has three separable stages:
  1. store  — the whole dataset decoded once into a uint8 tensor N×3×H×W (CIFAR) or read from disk;
  2. augment — per-sample uint8 transforms (crop+flip, AutoAugment/RandAugment) in DataLoader workers;
  3. normalise (+ random erasing, Mixup/CutMix) — per batch on the device, in the LightningModule.
Batches are therefore uint8 images and integer labels; ``mean``/``std`` belong to the model
(``ViTClassifier``), so a checkpoint preprocesses exactly as training did.
"""

from __future__ import annotations

import pickle
import tarfile
import urllib.error
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset
from torchvision.transforms import v2

from vit.images import find_images, load_image

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


class DatasetError(RuntimeError):
    """A dataset that is missing, malformed or cannot be fetched; the message says what to do."""


# --- reading the official files safely ------------------------------------------------------

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


def read_cifar_meta(path: Path) -> list[str]:
    meta = _load_pickle(path)
    names = meta.get("label_names")
    if not isinstance(names, list) or not names or not all(isinstance(n, (bytes, str)) for n in names):
        raise DatasetError(f"{path}: 'label_names' must be a non-empty list of strings")
    return [n.decode() if isinstance(n, bytes) else n for n in names]


def read_cifar_batch(path: Path, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
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


class TensorImageDataset(Dataset):
    """Stage 1 (a uint8 tensor in memory) with stage 2 (per-sample uint8 transform)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform=None):
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        image = self.images[i]
        return (self.transform(image) if self.transform else image), self.labels[i]


def stratified_split(labels: torch.Tensor, val_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded split with each class's share of the validation set equal to its share of the data."""
    if not 0 <= val_size < len(labels):
        raise ValueError(f"val_size must be in [0, {len(labels)}), got {val_size}")
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(labels), generator=g)
    counts = torch.bincount(labels)
    # rank of each sample inside its class (in shuffled order), as a fraction of the class size
    order = perm[torch.argsort(labels[perm], stable=True)]
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(labels)
    rank[order] = torch.arange(len(labels)) - starts[labels[order]]
    frac = (rank.double() + 0.5) / counts[labels].double()
    picked = torch.argsort(frac + torch.rand(len(labels), generator=g, dtype=torch.float64) * 1e-9)
    val_idx, train_idx = picked[:val_size], picked[val_size:]
    return train_idx.sort().values, val_idx.sort().values


def train_transform(image_size: int, crop_padding: int, hflip: bool, auto_augment: str | None):
    """Stage 2 on uint8 tensors: random crop with padding, flip, optional AutoAugment/RandAugment."""
    steps = []
    if crop_padding > 0:
        steps.append(v2.RandomCrop(image_size, padding=crop_padding, padding_mode="reflect"))
    if hflip:
        steps.append(v2.RandomHorizontalFlip())
    if auto_augment:
        name, _, arg = auto_augment.partition("-")
        if name == "autoaugment":
            steps.append(v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10))
        elif name == "randaugment":  # randaugment or randaugment-N-M (N ops of magnitude M)
            n, _, m = arg.partition("-")
            steps.append(v2.RandAugment(num_ops=int(n or 2), magnitude=int(m or 9)))
        elif name == "trivialaugment":
            steps.append(v2.TrivialAugmentWide())
        else:
            raise ValueError(f"auto_augment must be autoaugment, randaugment[-N-M] or trivialaugment, got {auto_augment!r}")
    return v2.Compose(steps) if steps else None


class CIFAR10DataModule(L.LightningDataModule):
    """CIFAR-10 (or any dataset in its official python format) as uint8 batches."""

    url = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    archive_md5 = "c58f30108f718f92721af3b95e74349a"
    folder = "cifar-10-batches-py"
    train_files = tuple(f"data_batch_{i}" for i in range(1, 6))
    test_file = "test_batch"

    def __init__(
        self,
        root: str = "data",
        batch_size: int = 128,
        val_size: int = 5000,
        num_workers: int = 4,
        seed: int = 0,
        image_size: int = 32,
        crop_padding: int = 4,
        hflip: bool = True,
        auto_augment: str | None = None,
        download: bool = True,
        pipeline: str = "workers",
    ):
        """``pipeline``: "workers" (per-sample uint8 transforms in DataLoader workers, any policy) or
        "device" (the train set resident on the GPU, crop+flip per sample in one batched gather;
        ``vit.device_data``)."""
        super().__init__()
        self.save_hyperparameters()
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if pipeline not in ("workers", "device"):
            raise ValueError(f"pipeline must be 'workers' or 'device', got {pipeline!r}")
        if pipeline == "device" and (auto_augment or image_size != 32):
            raise ValueError("pipeline 'device' does crop+flip on 32×32 images only: "
                             "use pipeline 'workers' for auto_augment or resizing")
        if val_size < 0:
            raise ValueError(f"val_size must be non-negative, got {val_size}")
        train_transform(32, crop_padding, hflip, auto_augment)  # validate the choice now
        self.root = Path(root)
        self.classes: list[str] | None = None
        self._train_epochs = 0  # train iterators made so far (device pipeline; saved in checkpoints)

    # --- stage 1 ---------------------------------------------------------------------------
    @property
    def data_dir(self) -> Path:
        return self.root / self.folder

    def _complete(self) -> bool:
        return all((self.data_dir / f).is_file() for f in (*self.train_files, self.test_file, "batches.meta"))

    def prepare_data(self) -> None:
        """Download and extract the official archive when the extracted folder is absent."""
        if self._complete():
            return
        if not self.hparams.download:
            raise DatasetError(f"CIFAR-10 not found: expected the folder {self.data_dir} "
                               f"with {', '.join(self.train_files)}, {self.test_file} and batches.meta")
        from torchvision.datasets.utils import download_and_extract_archive

        try:  # torchvision re-fetches an archive whose md5 is wrong (partial or corrupt download)
            download_and_extract_archive(self.url, str(self.root), md5=self.archive_md5)
        except (urllib.error.URLError, OSError, RuntimeError, tarfile.TarError) as e:
            raise DatasetError(
                f"CIFAR-10 is not in {self.data_dir} and could not be downloaded from {self.url} ({e}). "
                f"Download and extract cifar-10-python.tar.gz yourself so that {self.data_dir} "
                f"holds data_batch_1..5, test_batch and batches.meta, or pass --data.root DIR "
                f"for a DIR that contains {self.folder}/."
            ) from None
        if not self._complete():
            raise DatasetError(f"the downloaded archive did not contain {self.data_dir} with all batch files")

    def _read(self, files) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [read_cifar_batch(self.data_dir / f, len(self.classes)) for f in files]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def setup(self, stage: str | None = None) -> None:
        if not self._complete():
            self.prepare_data()  # e.g. when used without a Trainer
        self.classes = read_cifar_meta(self.data_dir / "batches.meta")
        hp = self.hparams
        resize = [] if hp.image_size == 32 else [v2.Resize((hp.image_size, hp.image_size), antialias=True)]
        eval_tf = v2.Compose(resize) if resize else None
        if stage in (None, "fit", "validate"):
            images, labels = self._read(self.train_files)
            train_idx, val_idx = stratified_split(labels, hp.val_size, hp.seed)
            aug = train_transform(hp.image_size, hp.crop_padding, hp.hflip, hp.auto_augment)
            train_tf = v2.Compose(resize + ([aug] if aug else [])) if (resize or aug) else None
            self.train_set = Subset(TensorImageDataset(images, labels, train_tf), train_idx)
            self.val_set = Subset(TensorImageDataset(images, labels, eval_tf), val_idx)
        if stage in (None, "test", "predict"):
            images, labels = self._read([self.test_file])
            self.test_set = TensorImageDataset(images, labels, eval_tf)

    @property
    def num_classes(self) -> int:
        """From batches.meta when the data is here; CIFAR-10's 10 before it is downloaded."""
        if self.classes is None and self._complete():
            self.classes = read_cifar_meta(self.data_dir / "batches.meta")
        return len(self.classes) if self.classes is not None else 10

    # --- loaders ---------------------------------------------------------------------------
    def _loader(self, dataset, train: bool) -> DataLoader:
        # Workers are not persistent: each epoch's workers are seeded from that epoch's RNG state,
        # which is what makes a resumed run identical to an uninterrupted one (training.EpochSeed).
        return DataLoader(dataset, batch_size=self.hparams.batch_size, shuffle=train, drop_last=train,
                          num_workers=self.hparams.num_workers, pin_memory=torch.cuda.is_available())

    def train_dataloader(self):
        if self.hparams.pipeline == "workers":
            return self._loader(self.train_set, train=True)
        from vit.device_data import DeviceBatches

        trainer = self.trainer
        device = trainer.strategy.root_device if trainer else torch.device("cpu")
        base = self.train_set.dataset
        idx = self.train_set.indices
        return DeviceBatches(base.images[idx].to(device), base.labels[idx].to(device), self.hparams.batch_size,
                             self.hparams.seed, epoch=self._next_train_epoch,
                             rank=trainer.global_rank if trainer else 0,
                             world_size=trainer.world_size if trainer else 1,
                             padding=self.hparams.crop_padding, hflip=self.hparams.hflip)

    def _next_train_epoch(self) -> int:
        """Epochs are counted here, and saved in checkpoints: Lightning makes the first train iterator
        of a resumed fit before it restores its own epoch counter."""
        self._train_epochs += 1
        return self._train_epochs - 1

    def state_dict(self) -> dict:
        return {"train_epochs": self._train_epochs}

    def load_state_dict(self, state_dict: dict) -> None:
        self._train_epochs = state_dict.get("train_epochs", 0)

    def val_dataloader(self):
        return self._loader(self.val_set, train=False)

    def test_dataloader(self):
        return self._loader(self.test_set, train=False)


class ImageFileDataset(Dataset):
    def __init__(self, files: list[Path], labels: list[int], transform):
        self.files, self.labels, self.transform = files, torch.tensor(labels, dtype=torch.int64), transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i):
        return self.transform(load_image(self.files[i])), self.labels[i]


class ImageFolderDataModule(CIFAR10DataModule):
    """Your own images, one folder per class: ``root/train/<class>/*`` and optionally ``root/val/``
    and ``root/test/`` with the same class folders (without ``val/``, ``val_size`` images are split
    off ``train/``, stratified; without ``test/``, testing uses the validation images). Images of any
    size and mode are resized to ``image_size``×``image_size``, then augmented like CIFAR-10."""

    def __init__(self, root: str = "data/images", batch_size: int = 64, val_size: int = 0, num_workers: int = 4,
                 seed: int = 0, image_size: int = 224, crop_padding: int = 0, hflip: bool = True,
                 auto_augment: str | None = None):
        super().__init__(root, batch_size, val_size, num_workers, seed, image_size, crop_padding, hflip,
                         auto_augment, download=False)
        train = self.root / "train"
        if not train.is_dir():
            raise DatasetError(f"{train} is not a folder: expected {self.root}/train/<class>/<images>")
        self.classes = sorted(d.name for d in train.iterdir() if d.is_dir())
        if not self.classes:
            raise DatasetError(f"{train} has no class folders")

    def _scan(self, split: str) -> tuple[list[Path], list[int]] | None:
        folder = self.root / split
        if not folder.is_dir():
            return None
        files, labels = [], []
        for label, name in enumerate(self.classes):
            found = find_images([folder / name]) if (folder / name).is_dir() else []
            files += found
            labels += [label] * len(found)
        if not files:
            raise DatasetError(f"{folder} holds no images in the class folders {self.classes}")
        return files, labels

    def prepare_data(self) -> None:
        pass

    def setup(self, stage: str | None = None) -> None:
        hp = self.hparams
        resize = v2.Resize((hp.image_size, hp.image_size), antialias=True)
        aug = train_transform(hp.image_size, hp.crop_padding, hp.hflip, hp.auto_augment)
        train_tf = v2.Compose([resize] + ([aug] if aug else []))
        files, labels = self._scan("train")
        val = self._scan("val")
        if val is None:
            train_idx, val_idx = stratified_split(torch.tensor(labels), hp.val_size, hp.seed)
            val = ([files[i] for i in val_idx], [labels[i] for i in val_idx])
            files, labels = [files[i] for i in train_idx], [labels[i] for i in train_idx]
        self.train_set = ImageFileDataset(files, labels, train_tf)
        self.val_set = ImageFileDataset(*val, resize)
        self.test_set = ImageFileDataset(*(self._scan("test") or val), resize)

    @property
    def num_classes(self) -> int:
        return len(self.classes)
