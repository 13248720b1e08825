"""The data: CIFAR-10 and image folders as data modules, device batches, what reads, indexes, seeds, resumes them."""

import importlib
import pkgutil

# vit.data.datamodules's public names (the module that was vit/data.py), also under the package's own
# (vit.data.CIFAR10DataModule), imported when first used (PEP 562): the package's other modules start without torch.
_SUBMODULES = {m.name for m in pkgutil.iter_modules(__path__)}


def __getattr__(name: str):
    if name in _SUBMODULES:  # (`from vit.data import <module>` asks here before it imports the module)
        return importlib.import_module(f"{__name__}.{name}")
    if not name.startswith("_"):
        module = importlib.import_module("vit.data.datamodules")
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
