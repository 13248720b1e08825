"""The model is the standard ViT of the notes: shapes, parameter count, timm equivalence, attention."""

import pytest
import torch
from einops import rearrange
from timm.models.vision_transformer import VisionTransformer as TimmViT

import vit
from vit.models.model import Block, ViTConfig
from learned import steps_to_fit_random_labels

CONFIGS = [
    dict(image_size=32, patch_size=4, in_channels=3, num_classes=10, dim=48, depth=2, heads=3),
    dict(image_size=28, patch_size=7, in_channels=1, num_classes=7, dim=32, depth=3, heads=4),
    dict(image_size=16, patch_size=8, in_channels=4, num_classes=100, dim=24, depth=1, heads=2, mlp_ratio=2.5),
]


def closed_form_param_count(image_size, patch_size, in_channels, num_classes, dim, depth, heads, mlp_ratio=4.0):
    P, C, D, K, L = patch_size, in_channels, dim, num_classes, depth
    N = (image_size // patch_size) ** 2
    D_ff = int(mlp_ratio * D)
    # per block: 2 LayerNorms (4D) + W^{Q,K,V} (3D² + 3D) + W^o (D² + D) + MLP (2·D·D_ff + D_ff + D)
    block = 4 * D + 3 * D * D + 3 * D + D * D + D + 2 * D * D_ff + D_ff + D
    if mlp_ratio == 4.0:
        assert block == 12 * D * D + 13 * D  # the notes' closed form
    return P * P * C * D + D + D + (N + 1) * D + L * block + 2 * D + D * K + K


@pytest.mark.parametrize("cfg", CONFIGS)
def test_shapes_and_attention_maps(cfg):
    model = vit.VisionTransformer(vit.ViTConfig(**cfg)).eval()
    x = torch.randn(5, cfg["in_channels"], cfg["image_size"], cfg["image_size"])
    logits, attentions = model(x, return_attention=True)
    n_tokens = (cfg["image_size"] // cfg["patch_size"]) ** 2 + 1
    assert logits.shape == (5, cfg["num_classes"])
    assert len(attentions) == cfg["depth"]
    for attn in attentions:
        assert attn.shape == (5, cfg["heads"], n_tokens, n_tokens)
        torch.testing.assert_close(attn.sum(-1), torch.ones(5, cfg["heads"], n_tokens))
        assert (attn >= 0).all()


@pytest.mark.parametrize("cfg", CONFIGS)
def test_parameter_count_matches_closed_form(cfg):
    model = vit.VisionTransformer(vit.ViTConfig(**cfg))
    assert sum(p.numel() for p in model.parameters()) == closed_form_param_count(**cfg)


def test_presets_are_cifar_sized():
    for name in ("vit_tiny", "vit_small", "vit_base"):
        model = vit.create_model(name, depth=1)
        assert model.config.patch_size == 4 and model.config.image_size == 32
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert vit.create_model("vit_small").config.dim == 384
    with pytest.raises(ValueError, match="unknown preset"):
        vit.create_model("vit_huge_typo")


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(image_size=30, patch_size=4), "not divisible by patch_size"),
        (dict(dim=100, heads=3), "not divisible by heads"),
        (dict(depth=0), "depth must be a positive integer"),
        (dict(patch_size=-4), "patch_size must be a positive integer"),
        (dict(num_classes=0), "num_classes"),
        (dict(dim=2.5), "dim must be a positive integer"),
        (dict(mlp_ratio=0.0), "mlp_ratio"),
        (dict(dropout=1.5), "dropout"),
    ],
)
def test_bad_configuration_is_a_clear_value_error(bad, message):
    with pytest.raises(ValueError, match=message):
        vit.VisionTransformer(vit.ViTConfig(**bad))


def test_wrong_input_shape_is_a_clear_error():
    model = vit.VisionTransformer(vit.ViTConfig(dim=32, depth=1, heads=2))
    with pytest.raises(ValueError, match="expected images of shape"):
        model(torch.randn(2, 1, 32, 32))


def _random_timm(cfg, seed, **timm_args):
    torch.manual_seed(seed)
    timm_model = TimmViT(
        img_size=cfg["image_size"], patch_size=cfg["patch_size"], in_chans=cfg["in_channels"],
        num_classes=cfg["num_classes"], embed_dim=cfg["dim"], depth=cfg["depth"],
        num_heads=cfg["heads"], mlp_ratio=cfg.get("mlp_ratio", 4.0), **timm_args,
    ).eval()
    with torch.no_grad():  # timm's init leaves LayerNorms at 1/0 and [cls] near 0: perturb everything
        for p in timm_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return timm_model


@pytest.mark.parametrize("cfg", CONFIGS)
def test_equivalent_to_timm_after_loading_its_weights(cfg):
    timm_model = _random_timm(cfg, seed=0)
    model = vit.VisionTransformer(vit.ViTConfig(**cfg)).eval()
    vit.load_timm_state_dict(model, timm_model.state_dict())
    x = torch.randn(4, cfg["in_channels"], cfg["image_size"], cfg["image_size"])
    with torch.no_grad():
        expected = timm_model(x)
        torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model(x, return_attention=True)[0], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("new_grid", [(4, 4), (6, 6), (4, 6), (10, 10)])
def test_e_pos_resampling_is_timms_as_a_matrix(new_grid):
    """vit.models.model.resample_pos_embedding applies timm's resample_abs_pos_embed as a linear map: the same
    values and the same gradient, for smaller, larger and non-square grids."""
    from timm.layers import resample_abs_pos_embed

    from vit.models.model import resample_pos_embedding

    torch.manual_seed(0)
    ours = torch.randn(1, 65, 24, requires_grad=True)
    theirs = ours.detach().clone().requires_grad_(True)
    a = resample_pos_embedding(ours, new_grid, (8, 8))
    b = resample_abs_pos_embed(theirs, list(new_grid), [8, 8], num_prefix_tokens=1)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    upstream = torch.randn_like(a)
    (a * upstream).sum().backward()
    (b * upstream).sum().backward()
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("new_grid", [(4, 4), (6, 10)])
def test_e_pos_resampling_runs_in_float32_under_bf16_autocast(new_grid):
    """The resize stages train under autocast: E_pos is still resampled in float32, as timm's
    resample_abs_pos_embed does it, to 1e-6 (bf16 rounding would differ by ~1e-3), and the model's own
    E_pos at a smaller grid is that resampling."""
    from timm.layers import resample_abs_pos_embed

    from vit.models.model import resample_pos_embedding

    torch.manual_seed(0)
    pos = torch.randn(1, 65, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = resample_pos_embedding(pos, new_grid, (8, 8))
        theirs = resample_abs_pos_embed(pos, list(new_grid), [8, 8], num_prefix_tokens=1)
    assert ours.dtype == theirs.dtype == torch.float32
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    model = vit.VisionTransformer(vit.ViTConfig(image_size=32, patch_size=4, dim=24, depth=1, heads=2))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model.pos_embedding.copy_(pos)
        at_grid = model.pos_embedding_at(*new_grid)
    torch.testing.assert_close(at_grid, theirs, rtol=0, atol=1e-6)


def test_a_smaller_image_sees_e_pos_resampled_as_timm_does():
    """Progressive resizing's forward: 16 px through a 32-px model equals timm's dynamic_img_size ViT
    (E_pos resampled with resample_abs_pos_embed), and the gradient reaches the full-size E_pos."""
    cfg = CONFIGS[0]
    timm_model = _random_timm(cfg, seed=2, dynamic_img_size=True)  # pos_embed resampled to the input's grid
    model = vit.VisionTransformer(vit.ViTConfig(**cfg))
    vit.load_timm_state_dict(model, timm_model.state_dict())
    x = torch.randn(3, cfg["in_channels"], 16, 16)
    logits = model(x)
    with torch.no_grad():
        torch.testing.assert_close(logits, timm_model(x), atol=1e-5, rtol=1e-5)
    logits.sum().backward()
    assert model.pos_embedding.shape[1] == 1 + (32 // cfg["patch_size"]) ** 2
    assert model.pos_embedding.grad is not None and model.pos_embedding.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="multiple of the patch size"):
        model(torch.randn(2, cfg["in_channels"], 18, 18))


def test_patch_embedding_matches_the_strided_convolution():
    cfg = CONFIGS[0]
    timm_model = _random_timm(cfg, seed=1)
    model = vit.VisionTransformer(vit.ViTConfig(**cfg))
    vit.load_timm_state_dict(model, timm_model.state_dict())
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        conv = rearrange(timm_model.patch_embed.proj(x), "b d h w -> b (h w) d")
        torch.testing.assert_close(model.patch_embedding(x), conv, atol=1e-5, rtol=1e-5)


def test_timm_mismatch_names_the_offending_keys():
    cfg = CONFIGS[0]
    state = _random_timm(cfg, seed=0).state_dict()
    model = vit.VisionTransformer(vit.ViTConfig(**{**cfg, "num_classes": 5}))
    with pytest.raises(ValueError, match=r"head\.weight: checkpoint \(10, 48\) vs model \(5, 48\)"):
        vit.load_timm_state_dict(model, state)
    del state["blocks.1.norm1.weight"]
    state["reg_token"] = torch.zeros(1, 1, 48)
    with pytest.raises(ValueError, match=r"missing keys: blocks\.1\.norm1\.weight.*unexpected keys: reg_token"):
        vit.load_timm_state_dict(vit.VisionTransformer(vit.ViTConfig(**cfg)), state)


def test_fused_and_explicit_attention_paths_agree_in_training_mode_without_dropout():
    torch.manual_seed(0)
    model = vit.VisionTransformer(vit.ViTConfig(dim=32, depth=2, heads=4)).train()
    x = torch.randn(3, 3, 32, 32)
    fused = model(x)
    explicit, _ = model(x, return_attention=True)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-5)


def test_block_without_pos_embedding_is_permutation_equivariant():
    torch.manual_seed(0)
    block = Block(ViTConfig(dim=32, heads=4)).eval()
    x = torch.randn(2, 17, 32)
    perm = torch.randperm(17)
    with torch.no_grad():
        torch.testing.assert_close(block(x[:, perm])[0], block(x)[0][:, perm], atol=1e-5, rtol=1e-5)


def test_patch_order_matters_only_through_pos_embedding():
    torch.manual_seed(0)
    model = vit.VisionTransformer(vit.ViTConfig(image_size=16, patch_size=4, dim=32, depth=2, heads=4)).eval()
    x = torch.randn(2, 3, 16, 16)
    # shuffle whole 4×4 patches of the image
    patches = rearrange(x, "b c (h p1) (w p2) -> b (h w) c p1 p2", p1=4, p2=4)
    shuffled = rearrange(patches[:, torch.randperm(16)], "b (h w) c p1 p2 -> b c (h p1) (w p2)", h=4)
    with torch.no_grad():
        assert not torch.allclose(model(x), model(shuffled), atol=1e-4)  # E_pos breaks the symmetry
        model.pos_embedding.zero_()
        torch.testing.assert_close(model(x), model(shuffled), atol=1e-5, rtol=1e-5)


def test_no_weight_decay_set_is_norms_biases_pos_and_cls():
    model = vit.VisionTransformer(vit.ViTConfig(dim=32, depth=2, heads=4))
    skip = model.no_weight_decay()
    assert {"cls_token", "pos_embedding", "norm.weight", "head.bias", "blocks.0.norm1.bias"} <= skip
    decayed = {n for n, _ in model.named_parameters()} - skip
    assert decayed == {n for n, p in model.named_parameters() if p.ndim == 2}


@pytest.mark.parametrize("patch_size, in_channels", [(4, 3), (8, 1)])
def test_initialisation_follows_timm(patch_size, in_channels):
    """Every parameter starts as timm's ViT starts it, E too: timm leaves its patch convolution at
    PyTorch's default, uniform(±1/√(P²C)) for weight and bias."""
    cfg = dict(image_size=32, patch_size=patch_size, in_channels=in_channels, num_classes=10, dim=192,
               depth=2, heads=3)
    torch.manual_seed(0)
    model = vit.VisionTransformer(vit.ViTConfig(**cfg))
    torch.manual_seed(1)
    timm_model = TimmViT(img_size=32, patch_size=patch_size, in_chans=in_channels, num_classes=10,
                         embed_dim=192, depth=2, num_heads=3)
    assert model.pos_embedding.std().item() == pytest.approx(0.02, rel=0.1)
    assert model.cls_token.abs().max().item() < 1e-4
    assert model.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert model.blocks[0].attn.qkv.bias.abs().sum().item() == 0
    bound = (patch_size * patch_size * in_channels) ** -0.5
    for e, e_bias in [(model.patch_embedding.proj.weight, model.patch_embedding.proj.bias),
                      (timm_model.patch_embed.proj.weight, timm_model.patch_embed.proj.bias)]:
        assert e.std().item() == pytest.approx(bound / 3**0.5, rel=0.05)  # uniform(±b): std b/√3
        assert e.abs().max().item() <= bound
        assert e_bias.abs().max().item() <= bound
        assert e_bias.abs().mean().item() == pytest.approx(bound / 2, rel=0.2)  # not zero: |U(±b)| averages b/2


def test_tiny_model_overfits_random_labels():
    """95 % of 64 random labels within 100 steps (tests/learned.py, checked every 5), seed 0; each of 24 seeds
    in results/test-margins/learned.json (`python tests/learned.py --seeds 24`) got there in 15 to 25."""
    torch.set_num_threads(1)  # a tiny model's ops: one thread, not two waiting on each other (conftest restores it)
    steps = steps_to_fit_random_labels(0)
    assert steps is not None and steps <= 100, f"95 % train accuracy after {steps} steps (None: not in 300)"
