"""Where the model looks: attention rollout (Abnar & Zuidema, 2020) and its gradient-weighted
variant (Chefer, Gur & Wolf, 2021), for the attention maps of ``model(x, return_attention=True)``."""

from __future__ import annotations

import math

import torch

HEAD_FUSIONS = ("mean", "max", "min")


def _fuse_heads(attn: torch.Tensor, head_fusion: str) -> torch.Tensor:
    if head_fusion == "mean":
        return attn.mean(dim=1)
    if head_fusion == "max":
        return attn.amax(dim=1)
    if head_fusion == "min":
        return attn.amin(dim=1)
    raise ValueError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}")


def _discard_lowest(a: torch.Tensor, discard_ratio: float) -> torch.Tensor:
    """Zero, in every row of every image, the ⌊ratio·N⌋ lowest of the N patch columns ([cls] column kept)."""
    n_patches = a.shape[-1] - 1
    k = int(discard_ratio * n_patches)
    if k == 0:
        return a
    lowest = a[..., 1:].topk(k, dim=-1, largest=False).indices + 1  # column indices, past [cls]
    return a.scatter(-1, lowest, 0.0)


def attention_rollout(
    attentions: list[torch.Tensor],
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    method: str = "rollout",
    gradients: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Rollout of the [cls] token over the N patches: B×N, raw (not rescaled).

    ``method="rollout"``: per layer Â = (fuse_heads(A) + I) / rowsum, R = Â_L ⋯ Â_1, read R[cls, patches].
    ``method="gradient"``: R = I, then per layer R ← R + mean_heads(clamp(∂y_c/∂A ⊙ A, min=0)) R
    (``gradients`` are ∂y_c/∂A for each layer; see ``explain``). Every image of the batch is treated alike.
    """
    if not attentions:
        raise ValueError("attentions is empty: call the model with return_attention=True")
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio!r}")
    batch, _, tokens, _ = attentions[0].shape
    eye = torch.eye(tokens, dtype=torch.float64, device=attentions[0].device).expand(batch, tokens, tokens)
    result = eye.clone()
    if method == "rollout":
        for attn in attentions:  # from the first block up
            a = _discard_lowest(_fuse_heads(attn.detach().double(), head_fusion), discard_ratio)
            a = a + eye  # the residual connection
            a = a / a.sum(dim=-1, keepdim=True)
            result = a @ result
    elif method == "gradient":
        if gradients is None or len(gradients) != len(attentions):
            raise ValueError("method='gradient' needs one gradient per attention map (see vit.models.rollout.explain)")
        for attn, grad in zip(attentions, gradients):
            cam = (grad.detach().double() * attn.detach().double()).clamp(min=0).mean(dim=1)
            result = result + cam @ result
    else:
        raise ValueError(f"method must be 'rollout' or 'gradient', got {method!r}")
    return result[:, 0, 1:].to(attentions[0].dtype)


def explain(model, images: torch.Tensor, method: str = "rollout", target: torch.Tensor | int | None = None,
            head_fusion: str = "mean", discard_ratio: float = 0.0):
    """Run ``model`` on normalised ``images`` and return (probabilities B×K, rollout B×√N×√N).

    For ``method="gradient"`` the class explained is ``target`` (an index, or one per image);
    by default the predicted class."""
    model.eval()
    with torch.enable_grad():
        logits, attentions = model(images, return_attention=True)
        gradients = None
        if method == "gradient":
            if target is None:
                target = logits.argmax(-1)
            target = torch.as_tensor(target, device=logits.device).expand(len(images))
            score = logits.gather(1, target[:, None]).sum()
            gradients = torch.autograd.grad(score, attentions)
    rollout = attention_rollout(attentions, head_fusion, discard_ratio, method, gradients)
    side = math.isqrt(rollout.shape[-1])
    return logits.detach().float().softmax(-1), rollout.detach().reshape(len(images), side, side)
