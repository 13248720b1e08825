"""vit: the standard Vision Transformer, trained with Lightning."""

from vit.model import (
    PRESETS,
    ViTConfig,
    VisionTransformer,
    create_model,
    load_timm_state_dict,
    timm_state_dict_to_vit,
)
from vit.rollout import attention_rollout

__all__ = [
    "PRESETS",
    "attention_rollout",
    "ViTConfig",
    "VisionTransformer",
    "create_model",
    "load_timm_state_dict",
    "timm_state_dict_to_vit",
]
__version__ = "0.1.0"
