"""The data: CIFAR-10 and image folders as data modules, device batches, what reads, indexes, seeds, resumes them."""

import importlib

# vit.data.datamodules's public names, also under the package's own (vit.data.CIFAR10DataModule), imported
# when first used (PEP 562): the package's other modules start without torch.
_EXPORTS = ("CIFAR10DataModule", "ImageDataModule", "ImageFolderDataModule")


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module("vit.data.datamodules"), name)
    raise AttributeError(f"module 'vit.data' has no attribute {name!r}")
