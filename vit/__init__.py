"""vit: the standard Vision Transformer, trained with Lightning."""

import importlib
import importlib.util
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names, for type checkers and editors
    from vit.models.model import (PRESETS, ViTConfig, VisionTransformer, create_model, load_timm_state_dict,
                                  timm_state_dict_to_vit)
    from vit.models.rollout import attention_rollout

# Each public name is imported when first used (PEP 562), so that commands without a model (vit-plan,
# vit-sync, vit-figures' rendering) start without importing torch.
_PUBLIC = {
    "PRESETS": "vit.models.model",
    "ViTConfig": "vit.models.model",
    "VisionTransformer": "vit.models.model",
    "create_model": "vit.models.model",
    "load_timm_state_dict": "vit.models.model",
    "timm_state_dict_to_vit": "vit.models.model",
    "attention_rollout": "vit.models.rollout",
}
__all__ = sorted(_PUBLIC)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'vit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])


# The modules that moved into the subpackages, by their old paths: `import vit.callbacks`, `from vit import runs`,
# a recipe's `class_path: vit.callbacks.Throughput` and a checkpoint pickled before the move resolve to the module
# of the new path, the very same module object (and classes).
MOVED = {
    "vit.callbacks": "vit.training.callbacks",
    "vit.checkpoint_io": "vit.cluster.checkpoint_io",
    "vit.checkpoints": "vit.models.checkpoints",
    "vit.cifar": "vit.data.cifar",
    "vit.demo": "vit.inference.demo",
    "vit.device_augment": "vit.data.device_augment",
    "vit.device_data": "vit.data.device_data",
    "vit.export": "vit.inference.export",
    "vit.folder_index": "vit.data.folder_index",
    "vit.folders": "vit.data.folders",
    "vit.gpus": "vit.cluster.gpus",
    "vit.guards": "vit.training.guards",
    "vit.hub": "vit.models.hub",
    "vit.images": "vit.data.images",
    "vit.launch": "vit.cluster.launch",
    "vit.loggers": "vit.training.loggers",
    "vit.memory": "vit.training.memory",
    "vit.model": "vit.models.model",
    "vit.module": "vit.training.module",
    "vit.network": "vit.cluster.network",
    "vit.optim": "vit.training.optim",
    "vit.plans.table": "vit.reporting.plan_table",
    "vit.preprocessing": "vit.models.preprocessing",
    "vit.progress": "vit.training.progress",
    "vit.report": "vit.reporting.report",
    "vit.results": "vit.training.results",
    "vit.resume": "vit.data.resume",
    "vit.rollout": "vit.models.rollout",
    "vit.run_lock": "vit.cluster.run_lock",
    "vit.runs": "vit.cluster.runs",
    "vit.schedule": "vit.training.schedule",
    "vit.seeding": "vit.data.seeding",
    "vit.step_profile": "vit.training.step_profile",
    "vit.storage": "vit.cluster.storage",
    "vit.sync": "vit.reporting.sync",
    "vit.tables": "vit.reporting.tables",
    "vit.visualize": "vit.models.visualize",
}


class _MovedModules:
    """The finder and loader (of sys.meta_path) of the modules of MOVED under their old paths: the new path's
    module, registered under both names."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec):
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__  # the import under the old name replaces it; exec_module restores it
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state


def names_of(package: str, path, module: str):
    """The ``__getattr__`` (PEP 562) of a package that took the place of a module (vit.data, vit.inference): the
    package's own modules by name, and the public names of ``module``, where the replaced module's code now is
    (``vit.data.CIFAR10DataModule``), imported when first used: the package's other modules start without torch."""
    import pkgutil

    submodules = {m.name for m in pkgutil.iter_modules(path)}

    def __getattr__(name: str):
        if name in submodules:  # (`from package import <module>` asks here before it imports the module)
            return importlib.import_module(f"{package}.{name}")
        if not name.startswith("_"):
            found = importlib.import_module(module)
            if hasattr(found, name):
                return getattr(found, name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return __getattr__


if not any(type(finder).__name__ == "_MovedModules" for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())
