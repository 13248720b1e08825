"""A trained model in use: classifying images, exporting it, and the browser demo's analysis."""

import importlib

# vit.inference.classifier's public names, also under the package's own (vit.inference.Classifier), imported
# when first used (PEP 562): the package's other modules start without torch.
_EXPORTS = ("Classifier", "classify_files", "load_classifier")


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module("vit.inference.classifier"), name)
    raise AttributeError(f"module 'vit.inference' has no attribute {name!r}")
