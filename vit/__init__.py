"""vit: the standard Vision Transformer, trained with Lightning."""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names, for type checkers and editors
    from vit.model import (PRESETS, ViTConfig, VisionTransformer, create_model, load_timm_state_dict,
                           timm_state_dict_to_vit)
    from vit.rollout import attention_rollout

# Each public name is imported when first used (PEP 562), so that commands without a model (vit-plan,
# vit-sync, vit-figures' rendering) start without importing torch.
_PUBLIC = {
    "PRESETS": "vit.model",
    "ViTConfig": "vit.model",
    "VisionTransformer": "vit.model",
    "create_model": "vit.model",
    "load_timm_state_dict": "vit.model",
    "timm_state_dict_to_vit": "vit.model",
    "attention_rollout": "vit.rollout",
}
__all__ = sorted(_PUBLIC)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'vit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
