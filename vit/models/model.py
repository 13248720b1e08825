"""The standard Vision Transformer (Dosovitskiy et al., 2021), as the notes define it.

Read top to bottom: PatchEmbedding (E), Attention (MHA with W^o), MLP, Block (pre-norm),
VisionTransformer. Framework-free: plain torch + einops. Converting timm weights lives at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn
from torchvision.ops import StochasticDepth

from vit.exits import ConfigError

__all__ = [
    "ViTConfig",
    "VisionTransformer",
    "PRESETS",
    "create_model",
    "load_pretrained",
    "load_timm_state_dict",
    "timm_state_dict_to_vit",
    "vit_state_dict_to_timm",
]


@dataclass(frozen=True)
class ViTConfig:
    """The architecture: the one definition of a ViT's shape, passed whole to ``VisionTransformer``.

    Args:
        image_size: side S of the square input image, in pixels.
        patch_size: side P of a square patch; N = (S/P)² patches.
        in_channels: channels C of the input image.
        num_classes: classes of the linear head on [cls].
        dim: width D of every token.
        depth: number L of encoder blocks.
        heads: attention heads h per block (d_k = D/h).
        mlp_ratio: hidden width of each block's MLP, as a multiple of D.
        dropout: dropout on E_pos-added tokens, MLP and W^o outputs.
        attn_dropout: dropout on the attention weights.
        drop_path: stochastic-depth rate of the last block (linear from 0 over depth).
        patch_drop: share of the N patch tokens dropped at random per image in training (timm's
            PatchDropout; [cls] is always kept): fewer tokens per step. Identity in eval mode.
    """

    image_size: int = 32
    patch_size: int = 4
    in_channels: int = 3
    num_classes: int = 10
    dim: int = 192
    depth: int = 12
    heads: int = 3
    mlp_ratio: float = 4.0
    dropout: float = 0.0
    attn_dropout: float = 0.0
    drop_path: float = 0.0
    patch_drop: float = 0.0

    def __post_init__(self):
        for name in ("image_size", "patch_size", "in_channels", "num_classes", "dim", "depth", "heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.image_size % self.patch_size:
            raise ConfigError(
                f"image_size {self.image_size} is not divisible by patch_size {self.patch_size}"
            )
        if self.dim % self.heads:
            raise ConfigError(f"dim {self.dim} is not divisible by heads {self.heads}")
        if not self.mlp_ratio > 0 or int(self.dim * self.mlp_ratio) < 1:
            raise ConfigError(f"mlp_ratio must be positive, got {self.mlp_ratio!r}")
        for name in ("dropout", "attn_dropout", "drop_path", "patch_drop"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {value!r}")

    @property
    def num_patches(self) -> int:  # N = HW / P²
        return (self.image_size // self.patch_size) ** 2

    @property
    def mlp_dim(self) -> int:  # D_ff
        return int(self.dim * self.mlp_ratio)


# CIFAR-sized presets (32×32, patch 4 → N = 64); widths as in DeiT-Ti/S and ViT-B.
PRESETS: dict[str, dict] = {
    "vit_tiny": dict(dim=192, depth=12, heads=3),
    "vit_small": dict(dim=384, depth=12, heads=6),
    "vit_base": dict(dim=768, depth=12, heads=12),
}


class PatchEmbedding(nn.Module):
    """Cut B×C×H×W into N patches of P²C values and project each by E ∈ R^{P²C×D}."""

    def __init__(self, patch_size: int, in_channels: int, dim: int):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Linear(patch_size * patch_size * in_channels, dim)  # E (and its bias)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        p = self.patch_size
        patches = rearrange(images, "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=p, p2=p)
        return self.proj(patches)  # x_p E


class Attention(nn.Module):
    """Multi-head scaled dot-product self-attention: concat_h(softmax(Q_h K_hᵀ/√d_k) V_h) W^o."""

    def __init__(self, dim: int, heads: int, attn_dropout: float = 0.0, dropout: float = 0.0):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5  # 1/√d_k
        self.qkv = nn.Linear(dim, 3 * dim)  # W^Q, W^K, W^V of all heads, fused
        self.attn_dropout = attn_dropout
        self.out_proj = nn.Linear(dim, dim)  # W^o
        self.out_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, return_attention: bool = False, cls_only: bool = False):
        qkv = rearrange(self.qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.heads)
        q, k, v = qkv.unbind(0)
        if cls_only:  # only the [cls] query: its row of softmax(QKᵀ/√d_k)V is exactly the same
            q = q[:, :, :1]
        p_drop = self.attn_dropout if self.training else 0.0
        if return_attention:
            attn = (q @ k.transpose(-2, -1) * self.scale).softmax(dim=-1)  # softmax(QKᵀ/√d_k)
            out = F.dropout(attn, p_drop, self.training) @ v
        else:
            attn = None
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p_drop)  # same, fused
        out = self.out_drop(self.out_proj(rearrange(out, "b h n d -> b n (h d)")))
        return out, attn


class MLP(nn.Module):
    """MLP(x) = GELU(x W_1 + b_1) W_2 + b_2."""

    def __init__(self, dim: int, mlp_dim: int, dropout: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, mlp_dim)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(dropout)
        self.fc2 = nn.Linear(mlp_dim, dim)
        self.drop2 = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class Block(nn.Module):
    """Pre-norm encoder block."""

    def __init__(self, cfg: ViTConfig, drop_path: float = 0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.dim, eps=1e-6)
        self.attn = Attention(cfg.dim, cfg.heads, cfg.attn_dropout, cfg.dropout)
        self.norm2 = nn.LayerNorm(cfg.dim, eps=1e-6)
        self.mlp = MLP(cfg.dim, cfg.mlp_dim, cfg.dropout)
        self.drop_path = StochasticDepth(drop_path, mode="row")

    def forward(self, x: torch.Tensor, return_attention: bool = False, cls_only: bool = False):
        h, attn = self.attn(self.norm1(x), return_attention, cls_only)
        if cls_only:
            x = x[:, :1]
        x = x + self.drop_path(h)  # z = x + MHA(LN(x))
        x = x + self.drop_path(self.mlp(self.norm2(x)))  # x' = z + MLP(LN(z))
        return x, attn


def resample_pos_embedding(pos_embedding: torch.Tensor, new_grid: tuple[int, int], grid: tuple[int, int]) -> torch.Tensor:
    """E_pos (1×(1+N)×D) resampled to another patch grid, [cls] kept, as timm's ``resample_abs_pos_embed``
    does it (antialiased bicubic, per channel). That resampling is linear in E_pos, so it is applied as a
    matrix: the interpolation of each grid cell's indicator, computed without gradient, then one matmul that
    carries E_pos's gradient. (Inductor, torch 2.14, cannot compile the backward of antialiased bicubic
    interpolation; this way the compiled model has no graph break and one graph per image size.)
    Like timm's, it computes in float32 (float64 for a float64 E_pos) whatever autocast is active, and
    returns E_pos's dtype: under bf16 autocast the matmul would otherwise round E_pos to bf16."""
    rows, cols = new_grid
    n = grid[0] * grid[1]
    dtype = torch.promote_types(pos_embedding.dtype, torch.float32)
    with torch.autocast(pos_embedding.device.type, enabled=False):
        with torch.no_grad():
            basis = torch.eye(n, device=pos_embedding.device, dtype=dtype).reshape(n, 1, *grid)
            weights = F.interpolate(basis, size=(rows, cols), mode="bicubic", antialias=True, align_corners=False)
        patches = weights.reshape(n, rows * cols).T @ pos_embedding[0, 1:].to(dtype)  # (rows·cols)×D
    return torch.cat([pos_embedding[:, :1], patches.to(pos_embedding.dtype)[None]], dim=1)


class VisionTransformer(nn.Module):
    """ViT: logits = head(LN(Encoder([x_cls; x_p E] + E_pos))[cls])."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        cfg = self.config = config
        self.patch_embedding = PatchEmbedding(cfg.patch_size, cfg.in_channels, cfg.dim)  # E
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.dim))  # x_cls
        self.pos_embedding = nn.Parameter(torch.zeros(1, cfg.num_patches + 1, cfg.dim))  # E_pos
        self.pos_drop = nn.Dropout(cfg.dropout)
        self.patch_drop = nn.Identity()
        if cfg.patch_drop:  # (timm imported only then: classify stays light)
            from timm.layers import PatchDropout

            self.patch_drop = PatchDropout(cfg.patch_drop, num_prefix_tokens=1)
        # Stochastic depth grows linearly with depth, as in DeiT and timm.
        rates = torch.linspace(0, cfg.drop_path, cfg.depth).tolist()
        self.blocks = nn.ModuleList(Block(cfg, rate) for rate in rates)
        self.norm = nn.LayerNorm(cfg.dim, eps=1e-6)
        self.head = nn.Linear(cfg.dim, cfg.num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """timm's ViT initialisation: trunc-normal(0.02) for E_pos and for every linear map but E, zero
        biases, LayerNorms at 1/0, [cls] near 0. E keeps PyTorch's default, uniform(±1/√(P²C)) for weight
        and bias, as timm's patch convolution does (its init touches only nn.Linear; E here is one, with the
        same fan-in as timm's convolution)."""
        nn.init.trunc_normal_(self.pos_embedding, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        self.patch_embedding.proj.reset_parameters()
        for module in self.modules():
            if module is self.patch_embedding.proj:
                continue
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def pos_embedding_at(self, rows: int, cols: int) -> torch.Tensor:
        """E_pos for a grid of rows × cols patches: the parameter itself at the configured grid, else
        resampled from it (timm's ``resample_abs_pos_embed``, [cls] kept) — what a smaller training
        image (progressive resizing, vit.training.module) sees, with its gradient flowing to the full-size E_pos."""
        grid = self.config.image_size // self.config.patch_size
        if (rows, cols) == (grid, grid):
            return self.pos_embedding
        return resample_pos_embedding(self.pos_embedding, (rows, cols), (grid, grid))

    def no_weight_decay(self) -> set[str]:
        """Parameters AdamW must not decay: norms, biases, E_pos and [cls] (timm's convention)."""
        return {n for n, p in self.named_parameters() if p.ndim <= 1} | {"cls_token", "pos_embedding"}

    def forward(self, images: torch.Tensor, return_attention: bool = False):
        cfg = self.config
        p, c = cfg.patch_size, cfg.in_channels
        if images.ndim != 4 or images.shape[1] != c or images.shape[2] % p or images.shape[3] % p:
            raise ValueError(f"expected images of shape B×{c}×{cfg.image_size}×{cfg.image_size} (or another "
                             f"multiple of the patch size {p}), got {tuple(images.shape)}")
        x = self.patch_embedding(images)  # B×N×D
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        pos = self.pos_embedding_at(images.shape[2] // p, images.shape[3] // p)
        x = self.pos_drop(torch.cat([cls, x], dim=1) + pos)  # z_0 = [x_cls; x_p E] + E_pos
        x = self.patch_drop(x)  # training only: a random subset of the patch tokens, [cls] kept
        attentions = []
        for i, block in enumerate(self.blocks):
            # The head reads only [cls] of the last block, so unless all attention maps are asked
            # for, that block computes the [cls] token alone: same logits, less work than timm.
            cls_only = i == len(self.blocks) - 1 and not return_attention
            x, attn = block(x, return_attention, cls_only)
            attentions.append(attn)
        logits = self.head(self.norm(x)[:, 0])  # y = head(LN(z_L^0))
        return (logits, attentions) if return_attention else logits


def flops_per_image(config: ViTConfig, train: bool = False) -> int:
    """The notes' analytic count: per block 2·(12·T·D² + 2·T²·D) forward, T = N+1 tokens — QKV, W^o and an
    MLP of ratio r are (4 + 2r)·T·D² multiply-adds (12 at r = 4), QKᵀ and AV 2·T²·D — plus E and the head;
    ×3 for a training step (the backward pass costs twice the forward)."""
    t, d = config.num_patches + 1, config.dim
    forward = config.depth * 2 * ((4 + 2 * config.mlp_ratio) * t * d * d + 2 * t * t * d)
    forward += 2 * config.num_patches * config.patch_size ** 2 * config.in_channels * d + 2 * d * config.num_classes
    return int(forward * (3 if train else 1))


def create_model(name: str, **overrides) -> VisionTransformer:
    """A preset by name (see PRESETS), with any constructor argument overridden."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return VisionTransformer(ViTConfig(**{**PRESETS[name], **overrides}))


# --- timm weights ---------------------------------------------------------------------------

_TIMM_RENAMES = {
    "patch_embed.proj.bias": "patch_embedding.proj.bias",
    "pos_embed": "pos_embedding",
    "attn.proj.": "attn.out_proj.",
}


def timm_state_dict_to_vit(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename a timm ``VisionTransformer`` state dict to ours; no shape checks.

    timm's patch embedding is a stride-P convolution with weight D×C×P×P; the same map as a
    matrix acting on patches flattened in (p1 p2 c) order is E = rearrange(w, 'd c p1 p2 -> d (p1 p2 c)').
    """
    out = {}
    for key, value in state_dict.items():
        if key == "patch_embed.proj.weight":
            if value.ndim != 4:
                raise ValueError(f"{key}: expected a D×C×P×P convolution weight, got {tuple(value.shape)}")
            out["patch_embedding.proj.weight"] = rearrange(value, "d c p1 p2 -> d (p1 p2 c)")
            continue
        for old, new in _TIMM_RENAMES.items():
            key = key.replace(old, new)
        out[key] = value
    return out


def vit_state_dict_to_timm(state_dict: dict[str, torch.Tensor], patch_size: int) -> dict[str, torch.Tensor]:
    """The inverse of ``timm_state_dict_to_vit``: our keys to timm's, E back to the stride-P conv weight."""
    out = {}
    for key, value in state_dict.items():
        if key == "patch_embedding.proj.weight":
            out["patch_embed.proj.weight"] = rearrange(value, "d (p1 p2 c) -> d c p1 p2", p1=patch_size, p2=patch_size)
            continue
        for timm_key, ours in _TIMM_RENAMES.items():
            key = key.replace(ours, timm_key)
        out[key] = value
    return out


def timm_model_args(config: ViTConfig) -> dict:
    """Arguments of timm's ``VisionTransformer`` that build this architecture (pre-norm, [cls] pooling,
    LayerNorm eps 1e-6, qkv bias: timm's defaults)."""
    return dict(img_size=config.image_size, patch_size=config.patch_size, in_chans=config.in_channels,
                num_classes=config.num_classes, embed_dim=config.dim, depth=config.depth, num_heads=config.heads,
                mlp_ratio=config.mlp_ratio)


def vit_config_from_timm(model_args: dict) -> ViTConfig:
    """``timm_model_args`` read back (timm's defaults where an argument is absent)."""
    img = model_args.get("img_size", 224)
    patch = model_args.get("patch_size", 16)
    return ViTConfig(image_size=img if isinstance(img, int) else img[0],
                     patch_size=patch if isinstance(patch, int) else patch[0],
                     in_channels=model_args.get("in_chans", 3), num_classes=model_args.get("num_classes", 1000),
                     dim=model_args.get("embed_dim", 768), depth=model_args.get("depth", 12),
                     heads=model_args.get("num_heads", 12), mlp_ratio=model_args.get("mlp_ratio", 4.0))


def load_timm_state_dict(model: VisionTransformer, state_dict: dict[str, torch.Tensor]) -> None:
    """Load a timm ViT state dict of the same shape into ``model``, strictly.

    Raises ValueError naming every missing, unexpected or mis-shaped key.
    """
    converted = timm_state_dict_to_vit(state_dict)
    own = model.state_dict()
    missing = sorted(set(own) - set(converted))
    unexpected = sorted(set(converted) - set(own))
    mismatched = [
        f"{k}: checkpoint {tuple(converted[k].shape)} vs model {tuple(own[k].shape)}"
        for k in sorted(set(own) & set(converted))
        if converted[k].shape != own[k].shape
    ]
    problems = []
    if missing:
        problems.append(f"missing keys: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {', '.join(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatch: {'; '.join(mismatched)}")
    if problems:
        raise ValueError("timm state dict does not fit this model — " + " | ".join(problems))
    model.load_state_dict(converted)


def load_pretrained(model: VisionTransformer, source: str) -> None:
    """Fine-tuning start: timm ViT weights from a local .pth/.safetensors state dict, or a timm model
    name (downloaded by timm). E_pos is resampled to this model's patch grid (timm's
    ``resample_abs_pos_embed``); a head of another shape is dropped and keeps our initialisation."""
    from pathlib import Path

    path = Path(source)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(path)
    elif path.suffix in (".pth", ".pt", ".bin"):
        state = torch.load(path, map_location="cpu", weights_only=True)
        state = state.get("state_dict", state.get("model", state))
    else:
        import timm

        state = timm.create_model(source, pretrained=True, num_classes=0).state_dict()
    own = model.state_dict()
    pos = state.get("pos_embed")
    if pos is not None and pos.shape != own["pos_embedding"].shape:
        from timm.layers import resample_abs_pos_embed

        grid = model.config.image_size // model.config.patch_size
        state["pos_embed"] = resample_abs_pos_embed(pos, [grid, grid], num_prefix_tokens=1)
    for key in ("head.weight", "head.bias"):
        if key not in state or state[key].shape != own[key].shape:
            state[key] = own[key]
    load_timm_state_dict(model, state)
