"""The data: CIFAR-10 and image folders as data modules, device batches, what reads, indexes, seeds, resumes them."""

from vit import names_of

__getattr__ = names_of(__name__, __path__, "vit.data.datamodules")  # (the module that was vit/data.py)
