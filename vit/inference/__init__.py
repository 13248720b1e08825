"""A trained model in use: classifying images, exporting it, and the browser demo's analysis."""

import importlib
import pkgutil

# vit.inference.classifier's public names (the module that was vit/inference.py), also under the package's own
# (vit.inference.Classifier), imported when first used (PEP 562): the package's other modules start without torch.
_SUBMODULES = {m.name for m in pkgutil.iter_modules(__path__)}


def __getattr__(name: str):
    if name in _SUBMODULES:  # (`from vit.inference import <module>` asks here before it imports the module)
        return importlib.import_module(f"{__name__}.{name}")
    if not name.startswith("_"):
        module = importlib.import_module("vit.inference.classifier")
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
