"""A data path whose cost is small next to the model's: the whole uint8 dataset lives on the device
(CIFAR-10 is 150 MB) and each batch is cropped and flipped there, per sample, in one gather, then
optionally AutoAugmented there, per sample, in a fixed number of batched operations (vit.data.device_augment).

``crop_flip`` is exactly torchvision's ``pad(reflect) → crop(top, left) → hflip`` for each image
(tests/test_device_data.py proves it), and ``vit.data.device_augment.AutoAugment`` exactly torchvision's
AutoAugment (tests/test_device_augment.py); ``DeviceBatches`` is the epoch-seeded, rank-sharded iterable
that Lightning uses as the train loader when ``--data.init_args.pipeline device``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vit.data.device_augment import CIFAR10_POLICY, AutoAugment
from vit.data.seeding import epoch_seed

AUTO_AUGMENT = ("autoaugment",)  # the policies DeviceBatches applies on the device (vit.data.device_augment)


def _reflect(index: torch.Tensor, size: int) -> torch.Tensor:
    """Reflect out-of-range indices as reflect padding does (the edge pixel is not repeated)."""
    index = index.abs()
    return torch.where(index > size - 1, 2 * (size - 1) - index, index)


def crop_flip(images: torch.Tensor, tops: torch.Tensor, lefts: torch.Tensor, flips: torch.Tensor,
              padding: int) -> torch.Tensor:
    """B×C×H×W → B×C×H×W: image b is reflect-padded by ``padding``, cropped at (tops[b], lefts[b])
    of the padded image, and mirrored left-right where flips[b]."""
    b, c, h, w = images.shape
    rows = _reflect(tops[:, None] - padding + torch.arange(h, device=images.device), h)  # B×H
    cols = lefts[:, None] - padding + torch.arange(w, device=images.device)  # B×W
    cols = _reflect(torch.where(flips[:, None], cols.flip(-1), cols), w)
    index = (rows[:, :, None] * w + cols[:, None, :]).view(b, 1, h * w).expand(b, c, h * w)
    return images.reshape(b, c, h * w).gather(2, index).view(b, c, h, w)


def crop_flip_draws(n: int, padding: int, hflip: bool, device: torch.device,
                    generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tops, lefts, flips) of ``n`` random crops with reflect padding and random horizontal flips."""
    tops, lefts = torch.randint(0, 2 * padding + 1, (2, n), device=device, generator=generator)
    flips = (torch.rand(n, device=device, generator=generator) < 0.5) if hflip else \
        torch.zeros(n, dtype=torch.bool, device=device)
    return tops, lefts, flips


def random_crop_flip(images: torch.Tensor, padding: int, hflip: bool = True,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Random crop with reflect padding and random horizontal flip, independently per image."""
    return crop_flip(images, *crop_flip_draws(images.shape[0], padding, hflip, images.device, generator), padding)


class DeviceBatches:
    """Batches of (uint8 images, labels) drawn from tensors already on the device, cropped and flipped,
    then, with ``auto_augment="autoaugment"``, AutoAugmented (torchvision's CIFAR-10 policy, per image; in
    the order of the workers pipeline: crop, flip, AutoAugment; ``compile``: by torch.compile's graph of it,
    as the model is compiled).

    Each epoch's order comes from a generator seeded with (seed, epoch), so it does not depend on the
    process's RNG state; under DDP rank r takes every world-th sample of that order, so each process reads
    only its shard, and step i of N processes together reads the images of step i of one process with
    N times the ``batch_size`` (the global batch). Each step's crops and flips, then its AutoAugment
    choices, are drawn for the whole global batch from a generator seeded with (seed, epoch, step), and
    each rank takes those of its images: an image's augmentation does not depend on the number of
    processes or the rank (nor its crops and flips on whether AutoAugment is on), and an epoch
    can start at any step exactly: ``position(batches, images per batch of all processes)`` says which
    epoch a new iterator is and its first batch (vit.data.resume.DataPosition). With ``accumulate`` batches per
    optimizer step, the draws are those of the optimizer step's images, and the epoch is whole optimizer
    steps: the images and augmentations of one batch ``accumulate`` times larger, however it is split. The
    last incomplete optimizer step is dropped.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, seed: int,
                 position: Callable[[int, int], tuple[int, int]], rank: int = 0, world_size: int = 1,
                 padding: int = 4, hflip: bool = True, accumulate: int = 1, auto_augment: str | None = None,
                 compile: bool = False):
        if auto_augment not in (None, *AUTO_AUGMENT):
            raise ValueError(f"DeviceBatches applies auto_augment {' or '.join(AUTO_AUGMENT)} (or none), "
                             f"got {auto_augment!r}")
        self.images, self.labels = images, labels
        self.batch_size, self.seed, self.position = batch_size, seed, position
        self.rank, self.world_size, self.padding, self.hflip = rank, world_size, padding, hflip
        self.accumulate = accumulate
        self.auto_augment = AutoAugment(CIFAR10_POLICY) if auto_augment else None
        self.compile, self._augment = compile, None

    def augment(self, images: torch.Tensor, draws) -> torch.Tensor:
        """AutoAugment with the given draws; with ``compile``, torch.compile's graph of it (a few kernels on a GPU
        where the eager batch issues some 200 ops), every batch alike: one image's eager pass first builds the
        tables the graph reads."""
        if self._augment is None:
            self.auto_augment.apply(images[:1], draws[:1])
            self._augment = torch.compile(self.auto_augment.apply, fullgraph=True, dynamic=False) \
                if self.compile else self.auto_augment.apply
        return self._augment(images, draws)

    def _share(self, draws, batch: slice):
        """This rank's images' draws, of those of the optimizer step (its ``batch`` of the global batch)."""
        return draws[batch][self.rank :: self.world_size]

    def __len__(self) -> int:
        return (len(self.labels) // self.world_size) // (self.batch_size * self.accumulate) * self.accumulate

    def __iter__(self):
        device = self.images.device
        epoch, start = self.position(len(self), self.batch_size * self.world_size)
        # one order for all ranks (seed, epoch); the global batch's augmentation draws (seed, epoch, step)
        order = torch.randperm(len(self.labels), device=device,
                               generator=torch.Generator(device=device).manual_seed(epoch_seed(self.seed, epoch)))
        shard = order[self.rank :: self.world_size]
        g = torch.Generator(device=device)
        global_batch = self.batch_size * self.world_size
        for i in range(start, len(self)):
            idx = shard[i * self.batch_size : (i + 1) * self.batch_size]
            images = self.images[idx]
            crop_flip_on = self.padding > 0 or self.hflip
            if crop_flip_on or self.auto_augment is not None:
                step, part = divmod(i, self.accumulate)  # the optimizer step's draws, and this batch's part of them
                g.manual_seed(epoch_seed(self.seed, epoch) * 100_003 + step)
                n, mine = global_batch * self.accumulate, slice(part * global_batch, (part + 1) * global_batch)
                if crop_flip_on:
                    draws = crop_flip_draws(n, self.padding, self.hflip, device, g)
                    images = crop_flip(images, *(self._share(d, mine) for d in draws), self.padding)
                if self.auto_augment is not None:
                    draws = self.auto_augment.draws(n, device, g)
                    images = self.augment(images, self._share(draws, mine))
            yield images, self.labels[idx]


class DeviceEvalBatches:
    """Validation batches of (uint8 images, labels) from tensors already on the device, in order, as they are
    stored (no augmentation): no loader, no copy from the host. Under DDP process r takes every world-th image,
    each image once (no padding), and the synced metrics sum the shares exactly."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, rank: int = 0,
                 world_size: int = 1):
        self.images, self.labels = images[rank::world_size], labels[rank::world_size]
        self.batch_size = batch_size

    def __len__(self) -> int:
        return -(-len(self.labels) // self.batch_size)

    def __iter__(self):
        for i in range(0, len(self.labels), self.batch_size):
            yield self.images[i : i + self.batch_size], self.labels[i : i + self.batch_size]
