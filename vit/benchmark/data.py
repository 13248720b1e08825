"""The data path: random crop + flip + normalise, ours (on the device, in workers) against torchvision's."""

from __future__ import annotations

import time

import torch

from vit.benchmark.common import sync
from vit.benchmark.report import format_table
from vit.data.cifar import write_fake


def _images_per_second(batches, device, limit: int) -> float:
    it = iter(batches)
    next(it)  # start workers / warm up
    sync(device)
    start, seen = time.perf_counter(), 0
    for images, _ in it:
        seen += len(images)
        if seen >= limit:
            break
    sync(device)
    return seen / (time.perf_counter() - start)


def bench_data(device: torch.device, batch_size: int, workers: int, n: int) -> dict:
    """Random crop (reflect pad 4) + flip + normalise, images/s: vit's device path, vit's DataLoader workers
    (uint8 torchvision.transforms.v2), and torchvision's CIFAR10 + PIL transforms, same workers."""
    import tempfile
    from pathlib import Path

    import torchvision
    from torchvision import transforms as T

    from vit.data.datamodules import CIFAR10DataModule
    from vit.data.device_data import DeviceBatches
    from vit.models.preprocessing import CIFAR10_MEAN, CIFAR10_STD, Normalize

    normalize = Normalize(CIFAR10_MEAN, CIFAR10_STD).to(device)

    class Normalised:  # the normalisation our LightningModule does on the device
        def __init__(self, batches):
            self.batches = batches

        def __iter__(self):
            for images, labels in self.batches:
                images = images.to(device, non_blocking=True)
                yield normalize(images), labels.to(device, non_blocking=True)

    class UncheckedCIFAR10(torchvision.datasets.CIFAR10):
        def _check_integrity(self):  # our generated files have their own md5s
            return True

        def _load_meta(self):  # (md5-checked in torchvision; the class names play no part here)
            self.classes = [f"c{i}" for i in range(10)]

    with tempfile.TemporaryDirectory() as tmp:
        write_fake(Path(tmp), n // 5, n // 5)
        dm = CIFAR10DataModule(root=tmp, batch_size=batch_size, val_size=10, num_workers=workers, download=False)
        dm.setup("fit")
        base = dm.train_set.dataset
        ours_device = DeviceBatches(base.images.to(device), base.labels.to(device), batch_size, seed=0,
                                    position=lambda n, per_batch: (0, 0))
        tv = UncheckedCIFAR10(tmp, train=True, download=False, transform=T.Compose([
            T.RandomCrop(32, padding=4, padding_mode="reflect"), T.RandomHorizontalFlip(), T.ToTensor(),
            T.Normalize(CIFAR10_MEAN, CIFAR10_STD)]))
        tv_loader = torch.utils.data.DataLoader(tv, batch_size=batch_size, shuffle=True, drop_last=True,
                                                num_workers=workers, pin_memory=device.type == "cuda")
        limit = n - 2 * batch_size
        row = {"batch_size": batch_size, "workers": workers,
               "img_s_ours_device": _images_per_second(Normalised(ours_device), device, limit),
               "img_s_ours_workers": _images_per_second(Normalised(dm.train_dataloader()), device, limit),
               "img_s_torchvision": _images_per_second(Normalised(tv_loader), device, limit)}
    row["ratio_device_vs_torchvision"] = row["img_s_ours_device"] / row["img_s_torchvision"]
    row["ratio_workers_vs_torchvision"] = row["img_s_ours_workers"] / row["img_s_torchvision"]
    return row


def section(report: dict, args, device: torch.device, dtype: torch.dtype) -> None:
    n = 1000 if args.quick else args.data_images
    report["data"] = [bench_data(device, 64 if args.quick else args.data_batch_size, args.workers, n)]
    print(f"# data path: crop(pad 4, reflect) + flip + normalise, images/s ({args.workers} workers for loaders)")
    print(format_table(report["data"], ["batch_size", "workers", "img_s_ours_device", "img_s_ours_workers",
                                        "img_s_torchvision", "ratio_device_vs_torchvision",
                                        "ratio_workers_vs_torchvision"]))
