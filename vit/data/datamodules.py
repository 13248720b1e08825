"""DataModules: a small shared base (uint8 batches, seeded stratified split, loaders, ``classes``) and
one module per source: CIFAR-10 in its official python format, and your own class folders.

The pipeline has three separable stages:
  1. store   — CIFAR-10 decoded once into a uint8 tensor N×3×32×32; image folders read from disk
               with the one loader everything shares (``vit.data.images.load_image``);
  2. augment — per-sample uint8 transforms (resize, crop+flip, AutoAugment/RandAugment) in DataLoader
               workers, or for CIFAR-10 on the device, per sample in batched operations (``pipeline:
               device``: crop+flip and AutoAugment, ``vit.data.device_data``, ``vit.data.device_augment``);
  3. normalise (+ random erasing, Mixup/CutMix) — per batch on the device, in the LightningModule.
Batches are uint8 images and integer labels; mean/std belong to the model (``vit.models.preprocessing``).
"""

from __future__ import annotations

import copy
import hashlib
import sys
from functools import partial
from pathlib import Path
from typing import Literal

import lightning as L
import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset, Subset
from torch.utils.data import default_collate
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2

from vit.cluster.launch import from_process_zero
from vit.data import cifar, folder_index
from vit.data.cifar import DatasetError
from vit.exits import ConfigError
from vit.data.images import ImageError, load_image
from vit.models.checkpoints import EARLIER, held_out_count
from vit.models.preprocessing import resize
from vit.data.resume import DataPosition, EpochOrder, SeededSamples

__all__ = ["CIFAR10DataModule", "DatasetError", "ImageDataModule", "ImageFolderDataModule"]


def stratified_split(labels: torch.Tensor, val_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded split with each class's share of the validation set equal to its share of the data."""
    if not 0 < val_size < len(labels):
        raise ConfigError(f"val_size must leave images on both sides: between 1 and {len(labels) - 1} "
                         f"of {len(labels)} images, got {val_size}")
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


def path_keys(paths: list[str], seed: int) -> torch.Tensor:
    """Each path's key in the seeded order an image folder's validation split takes (int64: 8 bytes of
    BLAKE2b of the seed and the path). A key depends on its own path alone: adding or removing an image
    changes no other image's key."""
    return torch.tensor([int.from_bytes(hashlib.blake2b(f"{seed}\0{path}".encode(errors="surrogateescape"),
                                                        digest_size=8).digest(), "big", signed=True)
                         for path in paths], dtype=torch.int64)


MIN_SHARE = 8  # images per process and step, at least, when a batch is split among processes


def split_batch(global_batch: int, processes: int, pairs: bool = False) -> int:
    """Each process's share of the global batch. Every process takes the same share, so that N processes
    see, step by step, the images one process would (vit.data.resume.EpochOrder) and DDP's mean of their
    gradients is the one process's gradient. ``pairs``: each share must be even (Mixup/CutMix mixes a
    process's images in pairs). A batch that does not split so is refused with the nearest global batches
    that do, before training: the global batch is never changed for the user."""
    share, rest = divmod(global_batch, processes)
    least = MIN_SHARE if processes > 1 else 1
    if not rest and share >= least and not (pairs and share % 2):
        return share
    multiple = 2 if pairs else 1
    step, smallest = processes * multiple, -(-least // multiple) * multiple * processes
    sizes = [s for s in ((global_batch - 1) // step * step, max(global_batch // step * step + step, smallest))
             if s >= smallest]
    use = " or ".join(str(s) for s in dict.fromkeys(sizes))
    mixing = " (Mixup/CutMix mixes each process's images in pairs: an even share)" if pairs else ""
    if share < least and not rest:
        raise ConfigError(f"--data.batch_size {global_batch} split among {processes} processes is {share} images "
                          f"per process and step, fewer than {MIN_SHARE}: too few to keep a device busy. Raise "
                          f"--data.batch_size to {smallest} or more, or use fewer devices")
    if rest:
        raise ConfigError(f"--data.batch_size {global_batch} is the global batch and must divide among the "
                          f"{processes} processes of this run{mixing}: use a multiple of {step}, e.g. {use}")
    where = f"{share} images per process" if processes > 1 else "one process's batch"
    raise ConfigError(f"--data.batch_size {global_batch} is {where}, an odd number, and Mixup/CutMix "
                      f"(--model.augmentation.mixup, --model.augmentation.cutmix) mixes each process's images in "
                      f"pairs: use {use} (a multiple of {step}), "
                      f"or turn Mixup and CutMix off")


def augmentation(crop_padding: int, hflip: bool, auto_augment: str | None, image_size: int):
    """Stage 2 on uint8 tensors: random crop with reflect padding, flip, optional AutoAugment/RandAugment."""
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
            raise ConfigError(f"auto_augment must be autoaugment, randaugment[-N-M] or trivialaugment, "
                             f"got {auto_augment!r}")
    return steps


class TensorImageDataset(Dataset):
    """Stage 1 (a uint8 tensor in memory) with stage 2 (a per-sample uint8 transform)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform=None):
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        image = self.images[i]
        return (self.transform(image) if self.transform else image), self.labels[i]


class ImageDataModule(L.LightningDataModule):
    """What every source shares: uint8 batches, a seeded stratified validation split, loaders."""

    def __init__(
        self,
        root: str,
        batch_size: PositiveInt = 128,
        val_size: int | float = 0.1,  # not PositiveInt | OpenUnitInterval: jsonargparse writes 0.1 of that as 0
        num_workers: NonNegativeInt = 4,
        seed: int = 0,
        image_size: PositiveInt = 32,
        crop_padding: NonNegativeInt = 4,
        hflip: bool = True,
        auto_augment: str | None = None,
    ):
        """
        Args:
            root: where the dataset is.
            batch_size: the global batch: images per step, all processes together (an optimizer step takes
                --trainer.accumulate_grad_batches of them); N processes take batch_size / N each
                (vit.data.datamodules.split_batch), so a recipe trains the same on 1 or 16 devices.
            val_size: validation images split off the training set: a count, or a fraction in (0, 1).
            num_workers: DataLoader worker processes per loader.
            seed: seed of the validation split.
            image_size: side every image is resized to (linked to model.arch.image_size).
            crop_padding: random crop after reflect padding by this many pixels (0: no crop).
            hflip: random horizontal flips.
            auto_augment: autoaugment, randaugment[-N-M] or trivialaugment (per image, in workers; CIFAR-10's
                pipeline device applies autoaugment on the device).
        """
        super().__init__()
        if root is None:  # (jsonargparse lets null through to a data module's str)
            raise ConfigError("root: give the folder the dataset is in, not null")
        if val_size < 1 if isinstance(val_size, int) else not 0 < val_size < 1:
            raise ConfigError(f"val_size must be a count of images (1 or more) or a fraction in (0, 1), got {val_size}")
        self.root = Path(root)
        self.batch_size, self.val_size, self.num_workers, self.seed = batch_size, val_size, num_workers, seed
        self.image_size = image_size
        self.augment = augmentation(crop_padding, hflip, auto_augment, image_size)  # validates the choice
        self.crop_padding, self.hflip = crop_padding, hflip
        self.classes: list[str] | None = None
        self.position = DataPosition()  # the train loader's epoch and first batch (vit.data.resume)
        self.resumed_train_images = None  # (the training images of the checkpoint resumed)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def train_transform(self):
        return v2.Compose([self.eval_transform(), *self.augment])

    def eval_transform(self):
        return partial(resize, size=self.image_size)  # vit.models.preprocessing: what inference does too

    def split(self, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stratified (train, validation) indices; ``val_size`` as a count or a fraction."""
        return stratified_split(labels, held_out_count(self.val_size, len(labels)), self.seed)

    def process_batch(self, train: bool = True) -> int:
        """This process's share of the global batch (``batch_size`` over the Trainer's processes; in training,
        even where the model mixes images in pairs)."""
        trainer = self.trainer
        if trainer is None:
            return self.batch_size
        pairs = train and getattr(trainer.lightning_module, "mixes_pairs", False)
        return split_batch(self.batch_size, trainer.world_size, pairs)

    def accumulation(self) -> int:
        """Batches per optimizer step (``--trainer.accumulate_grad_batches``): an epoch is cut into whole
        optimizer steps, so that B images × K batches train as one batch of B·K would, image for image."""
        return self.trainer.accumulate_grad_batches if self.trainer is not None else 1

    def check_train_size(self, images: int) -> None:
        """Refuse a training set too small for one optimizer step, before training."""
        step = self.batch_size * self.accumulation()
        if images < step:
            what = f"one batch of {self.batch_size}" if step == self.batch_size else \
                f"one optimizer step's {step} ({self.batch_size} × --trainer.accumulate_grad_batches {self.accumulation()})"
            raise ConfigError(f"the training set has {images} images, fewer than {what}: lower --data.batch_size")

    def run_dir(self) -> Path | None:
        """The run folder of the Trainer this module is attached to (vit.cluster.runs), if any."""
        return Path(self.trainer.default_root_dir) if self.trainer is not None else None

    # Training samples: each one's augmentation is seeded by (seed, epoch, position in the epoch's order), in
    # whichever worker (vit.data.resume), so a run resumed from any step, mid-epoch included, continues exactly.
    # Validation and test under DDP: each process reads its own share of the images, every image once
    # (Lightning's DistributedSampler would pad the shares to equal length with repeated images,
    # Lightning #2398; the synced metrics then sum the shares exactly).
    # Workers persist across epochs, as timm's loaders' do: forked once per loader, not every epoch. A fork
    # copies only the thread that forks, and under DDP the process has others (gloo's, NCCL's, the
    # launcher's); each fork is a chance to copy a lock one of them held (Python 3.12 warns of it). The
    # workers' base seed comes from a generator of the loader's own, not from the process's RNG: a loader
    # starts its workers once per run, and a resumed run starts them at another epoch than the run it
    # continues, so draws from the process's RNG would shift every later draw (dropout, mixing).
    def _loader(self, dataset, train: bool, collate_fn=None) -> DataLoader:
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        batch = self.process_batch(train)
        if train:
            sampler = EpochOrder(dataset, batch, self.seed, self.position, rank, world, self.accumulation())
            dataset = SeededSamples(dataset)
        elif world > 1:
            from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler

            sampler = UnrepeatedDistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
        else:
            sampler = None
        return DataLoader(dataset, batch_size=batch, drop_last=train, sampler=sampler,
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0,
                          generator=torch.Generator().manual_seed(self.seed), pin_memory=torch.cuda.is_available(),
                          collate_fn=collate_fn)

    def train_dataloader(self):
        self.check_train_size(len(self.train_set))
        theirs, resume = self.resumed_train_images, self.position.resume_at
        if resume is not None and isinstance(theirs, int) and theirs != len(self.train_set):
            rank_zero_info(f"warning: the training images changed since the checkpoint ({theirs:,} then, "
                           f"{len(self.train_set):,} now): the rest of epoch {resume[0]} is drawn over the images "
                           f"there now, from the checkpoint's place in it")
        return self._loader(self.train_set, train=True)

    def state_dict(self) -> dict:
        world = self.trainer.world_size if self.trainer is not None else 1
        state = self.position.state_dict(self.trainer, self.process_batch() * world,
                                         self.batch_size * self.accumulation())
        return {**state, "train_images": len(self.train_set)} if hasattr(self, "train_set") else state

    def load_state_dict(self, state_dict: dict) -> None:
        self.position.load_state_dict(state_dict)
        self.resumed_train_images = state_dict.get("train_images")

    def val_dataloader(self):
        return self._loader(self.val_set, train=False)

    def test_dataloader(self):
        return self._loader(self.test_set, train=False)


class CIFAR10DataModule(ImageDataModule):
    """CIFAR-10 (or any dataset in its official python format), held in memory as uint8."""

    url, archive_md5 = cifar.URL, cifar.ARCHIVE_MD5

    def __init__(self, root: str = "data", download: bool = True,
                 pipeline: Literal["workers", "device"] = "workers", **kwargs):
        """
        Args:
            root: the folder that holds cifar-10-batches-py/ (downloaded there when absent).
            download: download the official archive when the folder is absent.
            pipeline: "workers" (per-image transforms in DataLoader workers, any policy) or "device"
                (the train set resident on the accelerator, 32×32 as stored: crop+flip per image in one
                batched gather, then auto_augment autoaugment, if chosen, per image in batched operations,
                vit.data.device_augment).
        """
        super().__init__(root=root, **kwargs)
        self.download, self.pipeline = download, pipeline
        self.auto_augment = kwargs.get("auto_augment")
        if pipeline == "device":
            from vit.data.device_data import AUTO_AUGMENT

            if self.auto_augment not in (None, *AUTO_AUGMENT):
                raise ConfigError(f"pipeline 'device' applies auto_augment {' or '.join(AUTO_AUGMENT)} (or none), "
                                  f"not {self.auto_augment}: use pipeline 'workers' for it")
            if self.image_size != 32:
                raise ConfigError(f"pipeline 'device' takes CIFAR-10's 32×32 images as stored, not resized to "
                                  f"image_size {self.image_size}: use pipeline 'workers' for resizing")

    @property
    def folder(self) -> Path:
        return self.root / cifar.FOLDER

    def prepare_data(self) -> None:
        if cifar.is_complete(self.folder):
            return
        if not self.download:
            raise DatasetError(f"CIFAR-10 not found: expected the folder {self.folder} with "
                               f"{', '.join(cifar.TRAIN_FILES)}, {cifar.TEST_FILE} and {cifar.META_FILE}")
        cifar.download(self.root, self.url, self.archive_md5)

    def setup(self, stage: str | None = None) -> None:
        self.prepare_data()  # a no-op when the folder is complete; also makes the module usable alone
        self.classes = cifar.read_meta(self.folder / cifar.META_FILE)
        if stage in (None, "fit", "validate"):
            images, labels = cifar.read_split(self.folder, cifar.TRAIN_FILES, self.num_classes)
            train_idx, val_idx = self.split(labels)
            self.train_set = Subset(TensorImageDataset(images, labels, self.train_transform()), train_idx)
            self.val_set = Subset(TensorImageDataset(images, labels, self.eval_transform()), val_idx)
        if stage in (None, "test", "predict"):
            self.test_set = TensorImageDataset(*cifar.read_split(self.folder, [cifar.TEST_FILE], self.num_classes),
                                               self.eval_transform())

    def state_dict(self) -> dict:
        """The data's position, and how the validation images were split off the ``images`` (``split``), which a
        resume keeps (vit.models.checkpoints.check_split)."""
        split = {"val_size": self.val_size, "seed": self.seed}
        if hasattr(self, "val_set"):
            split["images"] = len(self.train_set) + len(self.val_set)
        return {**super().state_dict(), "split": split}

    @property
    def num_classes(self) -> int:
        """From batches.meta when the data is here; CIFAR-10's 10 before it is downloaded."""
        if self.classes is None and cifar.is_complete(self.folder):
            self.classes = cifar.read_meta(self.folder / cifar.META_FILE)
        return len(self.classes) if self.classes is not None else 10

    def train_dataloader(self):
        if self.pipeline == "workers":
            return super().train_dataloader()
        from vit.data.device_data import DeviceBatches

        self.check_train_size(len(self.train_set))
        trainer = self.trainer
        device = trainer.strategy.root_device if trainer else torch.device("cpu")
        base, idx = self.train_set.dataset, self.train_set.indices
        return DeviceBatches(base.images[idx].to(device), base.labels[idx].to(device), self.process_batch(),
                             self.seed, position=self.position.begin,
                             rank=trainer.global_rank if trainer else 0,
                             world_size=trainer.world_size if trainer else 1,
                             padding=self.crop_padding, hflip=self.hflip, accumulate=self.accumulation(),
                             auto_augment=self.auto_augment,
                             compile=bool(trainer and getattr(trainer.lightning_module, "hparams", {}).get("compile")))

    def val_dataloader(self):
        """On the device path the validation images live on the device too, 32×32 as stored (vit.data.device_data)."""
        if self.pipeline == "workers":
            return super().val_dataloader()
        from vit.data.device_data import DeviceEvalBatches

        trainer = self.trainer
        device = trainer.strategy.root_device if trainer else torch.device("cpu")
        base, idx = self.val_set.dataset, self.val_set.indices
        return DeviceEvalBatches(base.images[idx].to(device), base.labels[idx].to(device),
                                 self.process_batch(train=False), rank=trainer.global_rank if trainer else 0,
                                 world_size=trainer.world_size if trainer else 1)


class Unreadable(str):
    """The path of an image that failed to load after the setup check (a sample in its place)."""


class UnreadableBatch(list):
    """The paths of a batch none of whose images could be read (what the collate gives in its place)."""


def _skip_unreadable(batch, pairs: bool = False):
    """collate_fn: drop the images that failed to load after the setup check (see ClassFolder); with ``pairs``
    (Mixup/CutMix), an odd one too. None left: the batch's unreadable paths, an ``UnreadableBatch``."""
    readable = [sample for sample in batch if not isinstance(sample, Unreadable)]
    if pairs and len(readable) % 2:
        readable = readable[:-1]
    if not readable:
        return UnreadableBatch(sample for sample in batch if isinstance(sample, Unreadable))
    return default_collate(readable)


class SkipUnreadable:
    """A loader of image folders without its batches none of whose images could be read. Training: skipped on
    every process alike (all processes agree on each batch, in a gloo all-reduce that leaves the devices alone:
    skipping on one process only would desynchronise DDP's collectives), each counted in the data position
    (vit.data.resume.DataPosition), so that a resumed run reads on where it stopped. Validation and test: skipped
    by the process that reads it. Each skip is one line naming the files."""

    def __init__(self, loader: DataLoader, position: DataPosition | None, rank: int = 0, world: int = 1,
                 what: str = "training"):
        self.loader, self.position, self.rank, self.world, self.what = loader, position, rank, world, what
        self.group = None

    def __len__(self) -> int:
        return len(self.loader)

    # Lightning ends a stage by shutting down its loaders' persistent workers (its CombinedLoader.reset reads and
    # clears a loader's `_iterator`): this hands it the wrapped loader's. Without it the workers outlive the
    # stage until the wrapper is garbage-collected, and their shutdown then waits 5 s for each.
    @property
    def _iterator(self):
        return self.loader._iterator

    @_iterator.setter
    def _iterator(self, iterator) -> None:
        self.loader._iterator = iterator

    def _agree(self, unreadable: bool) -> bool:
        """Whether any process's batch is unreadable: one all-reduce, issued by every process for every batch."""
        import torch.distributed as dist

        if self.position is None or self.world == 1 or not dist.is_initialized():
            return unreadable
        if self.group is None:  # the first batch: every process makes the group here, in the same order
            self.group = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        flag = torch.tensor([int(unreadable)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flag.item())

    def __iter__(self):
        for batch in self.loader:
            unreadable = isinstance(batch, UnreadableBatch)
            if not self._agree(unreadable):
                if self.position is not None:
                    self.position.yielded += 1
                yield batch
                continue
            if self.position is not None:
                self.position.skipped.append(self.position.yielded)
            where = f"process {self.rank}: " if self.world > 1 else ""
            alike = " on every process" if self.world > 1 and self.position is not None else ""
            if unreadable:
                print(f"warning: {where}skipped a {self.what} batch{alike}: none of its images could be read "
                      f"({', '.join(batch)})", file=sys.stderr)
            elif self.rank == 0:
                print(f"warning: skipped a {self.what} batch on every process: another process could read none "
                      f"of its images (it names them)", file=sys.stderr)


class ClassFolder(ImageFolder):
    """torchvision's ImageFolder over ``root/<class>/...`` with a given class list (so train/, val/ and
    test/ index classes alike) and the samples the folder's index lists (vit.data.folder_index: no walk of its
    own), our loader (EXIF-aware, any mode). An image that fails to load after passing the setup check is
    skipped with one warning, never a worker traceback."""

    def __init__(self, root: Path, classes: list[str], transform, samples: list[tuple[str, int]]):
        self.fixed_classes, self.listed = classes, samples
        super().__init__(str(root), transform=transform, loader=load_image, allow_empty=True)

    def find_classes(self, directory):
        return self.fixed_classes, {c: i for i, c in enumerate(self.fixed_classes)}

    def make_dataset(self, directory, class_to_idx, extensions=None, is_valid_file=None, allow_empty=False):
        return list(self.listed)

    def drop(self, paths: set[str]) -> None:
        self.samples = self.imgs = [s for s in self.samples if s[0] not in paths]
        self.targets = [t for _, t in self.samples]

    def __getitem__(self, i):
        path, target = self.samples[i]
        try:
            image = self.loader(path)
        except ImageError as e:
            print(f"warning: skipping {path}: {e}", file=sys.stderr)
            return Unreadable(path)
        return self.transform(image), target


class ImageFolderDataModule(ImageDataModule):
    """Your own images, one folder per class: ``root/train/<class>/*``, optionally ``root/val/`` and
    ``root/test/`` with the same class folders. Without ``val/``, ``val_size`` of ``train/`` is held out
    for validation, stratified: each class's share, its images of smallest key (``path_keys``: a seeded hash
    of the image's path in train/). The checkpoint keeps that split as each class's largest key held out: a
    resumed run holds out the same images, and of the images added since, those whose key is within their
    class's limit (about the class's share); an image the run trained on is never held out. Without ``test/``,
    the validation images are used for the test. Every file is checked once per state of the folder, by one
    process, and the result kept in the folder's index (vit.data.folder_index), which later starts and the other
    processes reuse; unreadable ones are skipped (listed in the run folder's bad_files.txt) or stop the run
    before training. Images of any size and mode are resized to image_size × image_size."""

    def __init__(self, root: str, on_bad_file: Literal["skip", "error"] = "skip", index: str | None = None,
                 **kwargs):
        """
        Args:
            root: the folder that holds train/<class>/ (and optionally val/, test/).
            on_bad_file: "skip" unreadable images with one summary line, or "error": stop before training.
            index: the file that keeps the folder's index (its images, and which cannot be read), checked
                once per state of the folder (default: folder_index.json in the run folder; name one file
                to share it among runs of the same folder).
        """
        super().__init__(root=root, **kwargs)
        self.on_bad_file = on_bad_file
        self.index = Path(index) if index is not None else None
        train = self.root / "train"
        if not train.is_dir():
            raise DatasetError(f"{train} is not a folder: expected {self.root}/train/<class>/<images>")
        self.classes = sorted(d.name for d in train.iterdir() if d.is_dir())
        if not self.classes:
            raise DatasetError(f"{train} has no class folders: expected {train}/<class>/<images>")
        self.bad_files: dict[str, str] = {}
        self.recorded = None  # the split of the checkpoint this run resumes (load_state_dict)

    def index_path(self) -> Path | None:
        """Where the folder's index is kept: ``index``, else the run folder's (none without a Trainer)."""
        run_dir = self.run_dir()
        return self.index or (run_dir / folder_index.NAME if run_dir is not None else None)

    def _read_index(self) -> folder_index.FolderIndex:
        """The folder's index, from process 0 (which reads or builds it) to every process."""
        for split in ("val", "test"):
            folder = self.root / split
            extra = sorted(d.name for d in folder.iterdir() if d.is_dir() and d.name not in self.classes) \
                if folder.is_dir() else []
            if extra:
                raise DatasetError(f"{folder} has class folders that train/ lacks: {', '.join(extra)}")
        return from_process_zero(partial(folder_index.index, self.root, self.classes, self.index_path(),
                                                      self.num_workers, rank_zero_info), "folder index")

    def _skip_bad(self, index: folder_index.FolderIndex, datasets: list[ClassFolder]) -> None:
        """Skip the unreadable images (listed in the run folder's bad_files.txt), or stop; alike on every process."""
        self.bad_files = index.bad
        if not self.bad_files:
            return
        first = "; ".join(f"{Path(p).relative_to(self.root)} ({r})" for p, r in list(self.bad_files.items())[:3])
        more = f" and {len(self.bad_files) - 3} more" if len(self.bad_files) > 3 else ""
        if self.on_bad_file == "error":
            raise DatasetError(f"{len(self.bad_files)} of {index.images} images in {self.root} cannot be read: "
                               f"{first}{more}. Remove them, or pass --data.on_bad_file skip")
        listing = ""
        run_dir = self.run_dir()
        if run_dir is not None and self.trainer.is_global_zero:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "bad_files.txt").write_text("".join(f"{p}\t{r}\n" for p, r in self.bad_files.items()))
            listing = f" (all listed in {run_dir / 'bad_files.txt'})"
        rank_zero_info(f"skipping {len(self.bad_files)} of {index.images} images that cannot be read{listing}: "
                       f"{first}{more}")
        for ds in datasets:
            ds.drop(set(self.bad_files))

    def setup(self, stage: str | None = None) -> None:
        if not hasattr(self, "train_set"):  # fit, then test: the folders are scanned and checked once
            self._scan()

    def _scan(self) -> None:
        index = self._read_index()
        transforms = {"train": self.train_transform(), "val": self.eval_transform(), "test": self.eval_transform()}
        folders = {split: ClassFolder(self.root / split, self.classes, transforms[split], samples)
                   for split, samples in index.samples.items()}
        train, val, test = folders["train"], folders.get("val"), folders.get("test")
        self._skip_bad(index, list(folders.values()))
        if not train.samples:
            raise DatasetError(f"{self.root / 'train'} holds no readable images in the class folders {self.classes}")
        if test is None:
            rank_zero_info(f"{self.root} has no test/ folder: the validation images are used for the test")
        self.train_set, self.val_set, self.test_set = train, val, test or val
        if val is None:
            self.whole = train
            self.labels, self.keys = torch.tensor(train.targets), path_keys(self._relative(train), self.seed)
            self.held_out = self.draw_held_out()
        else:
            self.held_out = "val/"
        self._take(self.held_out if self.recorded is None else self.recorded)

    def _relative(self, train: ClassFolder) -> list[str]:
        """The training images' paths relative to train/ (``<class>/<file>``), as the folder's walk wrote them."""
        prefix = len(str(self.root / "train")) + 1
        return [path[prefix:] for path, _ in train.samples]

    def draw_held_out(self) -> dict:
        """This folder's split, drawn afresh: each class's stratified share of ``val_size`` (its count, as in
        CIFAR-10's split), taken as its images of smallest key; kept as each class's largest key taken (None:
        the class has no validation image). An image is held out while its key is at most its class's limit."""
        _, val_idx = self.split(self.labels)
        taken = torch.bincount(self.labels[val_idx], minlength=self.num_classes)
        order = self.keys.argsort()
        order = order[self.labels[order].argsort(stable=True)]  # by class, then by key
        counts = torch.bincount(self.labels, minlength=self.num_classes)
        ends = torch.cumsum(counts, 0) - counts + taken - 1
        limits = [self.keys[order[end]].item() if k else None for end, k in zip(ends.tolist(), taken.tolist())]
        return {"seed": self.seed, "val_size": self.val_size, "classes": list(self.classes), "limits": limits,
                "images": len(self.labels)}

    def _take(self, held_out: dict | str) -> None:
        """Hold out the validation images ``held_out`` names (``"val/"``: the val/ folder; ``EARLIER``: the
        split of an earlier version's checkpoint). vit-train has refused a checkpoint's split that this folder and
        command line cannot keep before any work (vit.models.checkpoints.check_split)."""
        if held_out == EARLIER and self.held_out == "val/":
            held_out = "val/"  # (what the earlier version validated on too)
        said, self.held_out = self.held_out == EARLIER, held_out
        if held_out == "val/":
            return
        if held_out == EARLIER:
            if not said:
                rank_zero_info(f"{self._checkpoint()}: records no validation split: its validation images are "
                               f"drawn by the seeded stratified split it was made with, over the images in "
                               f"{self.root / 'train'} now (if images were added or removed since, some it "
                               f"trained on may be among them: a new run rules that out)")
            held = torch.zeros(len(self.labels), dtype=torch.bool)
            held[self.split(self.labels)[1]] = True
        else:
            limits = torch.tensor([-1 if v is None else v for v in held_out["limits"]], dtype=torch.int64)
            some = torch.tensor([v is not None for v in held_out["limits"]])
            held = (self.keys <= limits[self.labels]) & some[self.labels]
        if not held.any():
            raise DatasetError(f"{self.root / 'train'} holds none of the run's validation images any more: "
                               f"start a new run")
        held_out_images = copy.copy(self.whole)  # the same scanned, checked files, with the validation transform
        held_out_images.transform = self.eval_transform()
        self.train_set = Subset(self.whole, (~held).nonzero().flatten().tolist())
        self.val_set = Subset(held_out_images, held.nonzero().flatten().tolist())
        self.test_set = self.test_set if isinstance(self.test_set, ClassFolder) else self.val_set

    def _checkpoint(self) -> str:
        """The checkpoint being restored, as the user named it."""
        return (self.trainer.ckpt_path if self.trainer is not None else None) or "the checkpoint"

    def state_dict(self) -> dict:
        """The data's position, and the run's split (``held_out``), which a resume keeps."""
        state = super().state_dict()
        return {**state, "held_out": self.held_out} if hasattr(self, "held_out") else state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self.recorded = state_dict.get("held_out", EARLIER)
        testing = self.trainer is not None and self.trainer.state.fn == "test"
        if testing and isinstance(self.test_set, ClassFolder):
            return  # (the test/ folder: the split changes nothing that is tested)
        if hasattr(self, "held_out"):  # (Lightning restores after setup)
            self._take(self.recorded)

    def _loader(self, dataset, train: bool, collate_fn=None) -> SkipUnreadable:
        trainer = self.trainer
        pairs = train and trainer is not None and getattr(trainer.lightning_module, "mixes_pairs", False)
        loader = super()._loader(dataset, train, collate_fn=partial(_skip_unreadable, pairs=pairs))
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        return SkipUnreadable(loader, self.position if train else None, rank, world,
                              "training" if train else "validation or test")
