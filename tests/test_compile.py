"""torch.compile gives the same model: compiled and eager logits agree."""

import pytest
import torch

import vit


def _can_compile() -> str | None:
    try:
        torch.compile(lambda x: x * 2)(torch.ones(2))
    except Exception as e:  # noqa: BLE001 - any backend failure means "cannot compile here"
        return f"torch.compile unavailable on this platform: {type(e).__name__}: {e}"
    return None


@pytest.mark.skipif(_can_compile() is not None, reason=str(_can_compile()))
def test_compiled_and_eager_logits_agree():
    torch.manual_seed(0)
    model = vit.VisionTransformer(vit.ViTConfig(image_size=16, patch_size=4, dim=32, depth=2, heads=2)).eval()
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        eager = model(x)
        model.compile()
        compiled = model(x)
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)
    assert set(model.state_dict()) == set(vit.VisionTransformer(vit.ViTConfig(image_size=16, patch_size=4, dim=32, depth=2,
                                                                 heads=2)).state_dict())  # same keys
