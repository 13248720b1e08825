"""A trained model in use: classifying images, exporting it, and the browser demo's analysis."""

from vit import names_of

__getattr__ = names_of(__name__, __path__, "vit.inference.classifier")  # (the module that was vit/inference.py)
