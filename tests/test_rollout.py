"""Attention rollout (Abnar & Zuidema 2020) and gradient rollout (Chefer et al. 2021)."""

import numpy as np
import pytest
import torch

import vit
from learned import rollout_figures


def reference_rollout(attentions, head_fusion, discard_ratio):
    """Straight from the paper, one image and one row at a time, in numpy."""
    batch, _, tokens, _ = attentions[0].shape
    out = []
    for b in range(batch):
        result = np.eye(tokens)
        for attn in attentions:
            a = getattr(np, head_fusion)(attn[b].numpy().astype(np.float64), axis=0)
            k = int(discard_ratio * (tokens - 1))
            for row in range(tokens):
                order = np.argsort(a[row, 1:], kind="stable")[:k] + 1
                a[row, order] = 0.0
            a = a + np.eye(tokens)
            a = a / a.sum(axis=1, keepdims=True)
            result = a @ result
        out.append(result[0, 1:])
    return torch.tensor(np.stack(out), dtype=torch.float32)


def random_attentions(batch=3, layers=2, heads=2, tokens=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(batch, heads, tokens, tokens, generator=g).softmax(-1) for _ in range(layers)]


def test_uniform_attention_by_hand():
    # A = 1/3 everywhere: Â = (A + I)/2 has [cls] row [2/3, 1/6, 1/6]; Â² has [cls] row [1/2, 1/4, 1/4].
    attentions = [torch.full((1, 2, 3, 3), 1 / 3) for _ in range(2)]
    torch.testing.assert_close(vit.attention_rollout(attentions), torch.tensor([[0.25, 0.25]]))


def test_discard_by_hand():
    # one layer, one head; [cls] row [0.5, 0.2, 0.3]: discarding half the 2 patch columns zeroes 0.2,
    # then (A + I) row [1.5, 0, 0.3] / 1.8.
    a = torch.tensor([[[[0.5, 0.2, 0.3], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]]]])
    torch.testing.assert_close(vit.attention_rollout([a], discard_ratio=0.5), torch.tensor([[0.0, 0.3 / 1.8]]))


@pytest.mark.parametrize("head_fusion", ["mean", "max", "min"])
@pytest.mark.parametrize("discard_ratio", [0.0, 0.5])
def test_matches_reference_for_every_fusion_and_discard(head_fusion, discard_ratio):
    attentions = random_attentions(batch=4, tokens=3)
    expected = reference_rollout(attentions, head_fusion, discard_ratio)
    got = vit.attention_rollout(attentions, head_fusion=head_fusion, discard_ratio=discard_ratio)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_batch_images_are_treated_alike():
    attentions = random_attentions(batch=5, layers=3, heads=4, tokens=17, seed=1)
    batched = vit.attention_rollout(attentions, head_fusion="max", discard_ratio=0.9)
    for i in range(5):
        single = vit.attention_rollout([a[i : i + 1] for a in attentions], head_fusion="max", discard_ratio=0.9)
        torch.testing.assert_close(batched[i : i + 1], single)


def test_identity_attention_gives_a_uniform_map():
    attentions = [torch.eye(17).expand(2, 3, 17, 17) for _ in range(4)]
    rollout = vit.attention_rollout(attentions)
    assert rollout.shape == (2, 16)
    torch.testing.assert_close(rollout, torch.full_like(rollout, rollout[0, 0].item()))


def test_gradient_rollout_follows_chefer_rule():
    attentions = random_attentions(batch=2, layers=2, heads=2, tokens=3, seed=2)
    gradients = [torch.randn_like(a) for a in attentions]
    r = torch.eye(3, dtype=torch.float64).expand(2, 3, 3)
    for a, g in zip(attentions, gradients):
        r = r + (g.double() * a.double()).clamp(min=0).mean(1) @ r
    got = vit.attention_rollout(attentions, method="gradient", gradients=gradients)
    torch.testing.assert_close(got, r[:, 0, 1:].float())
    with pytest.raises(ValueError, match="gradient"):
        vit.attention_rollout(attentions, method="gradient")
    with pytest.raises(ValueError, match="head_fusion"):
        vit.attention_rollout(attentions, head_fusion="median")


def test_rollout_of_a_trained_model_finds_the_patch_that_decides():
    """A tiny ViT trained on the bright-patch task (tests/learned.py), seed 0: accuracy 1.00, rollout at the
    decisive patch 4.3× its mean, its argmax there for every image, gradient rollout 6.3× its mean. Over 24
    seeds (results/test-margins/learned.json, `python tests/learned.py --seeds 24`), 23 learn the task in
    400 steps, and the thresholds keep a margin below the worst of those (`worst_learned`): accuracy 1.00
    (> 0.9), rollout 3.1× (> 2), its argmax on the patch for 82 % of images (> 50 %; chance 6 %), gradient
    rollout 1.4× (> 1.2). One seed (16) reaches 73 % in 400 steps and fails three of the four (its argmax
    share, 75 %, passes). One torch thread: a tiny model's ops are too small to share out, and on a busy
    machine two threads waiting on each other took 35 times the CPU time (conftest restores it)."""
    torch.set_num_threads(1)
    figures = rollout_figures(0)
    assert figures["accuracy"] > 0.9, figures
    assert figures["rollout_ratio"] > 2, f"rollout at the decisive patch is only {figures['rollout_ratio']:.1f}× its mean"
    assert figures["rollout_hits"] > 0.5, f"rollout peaks on the decisive patch for {figures['rollout_hits']:.0%} of images"
    assert figures["gradient_ratio"] > 1.2, \
        f"gradient rollout at the decisive patch is only {figures['gradient_ratio']:.1f}× its mean"
