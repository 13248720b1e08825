"""vit: the standard Vision Transformer, trained with Lightning."""

from vit.model import (
    PRESETS,
    ViTConfig,
    VisionTransformer,
    create_model,
    load_timm_state_dict,
    timm_state_dict_to_vit,
)

__all__ = [
    "PRESETS",
    "ViTConfig",
    "VisionTransformer",
    "create_model",
    "load_timm_state_dict",
    "timm_state_dict_to_vit",
]
__version__ = "0.1.0"
