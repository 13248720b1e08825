"""Training on your own class folders, and fine-tuning from timm weights."""

import pytest
import torch
from PIL import Image
from safetensors.torch import save_file
from timm.models.vision_transformer import VisionTransformer as TimmViT

from vit.data import DatasetError, ImageFolderDataModule
from vit.training import ViTClassifier


def _write_images(folder, n, colour, size):
    folder.mkdir(parents=True)
    for i in range(n):
        Image.new("RGB" if i % 2 else "L", (size + i, size), colour if i % 2 else colour[0]).save(folder / f"{i}.png")


def test_imagefolder_resizes_any_size_and_splits(tmp_path):
    _write_images(tmp_path / "train" / "red", 6, (200, 10, 10), 40)
    _write_images(tmp_path / "train" / "blue", 6, (10, 10, 200), 50)
    dm = ImageFolderDataModule(root=str(tmp_path), val_size=4, image_size=32, num_workers=0, batch_size=4)
    assert dm.classes == ["blue", "red"] and dm.num_classes == 2
    dm.setup("fit")
    assert len(dm.train_set) == 8 and len(dm.val_set) == 4 and len(dm.test_set) == 4
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.uint8
    assert set(labels.tolist()) <= {0, 1}


def test_imagefolder_missing_layout_is_clear(tmp_path):
    with pytest.raises(DatasetError, match="train/<class>"):
        ImageFolderDataModule(root=str(tmp_path))


@pytest.mark.parametrize("fmt", ["pth", "safetensors"])
def test_finetune_from_timm_weights_resamples_pos_embedding_and_replaces_head(tmp_path, fmt):
    torch.manual_seed(0)
    timm_model = TimmViT(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=1000)
    path = tmp_path / f"weights.{fmt}"
    state = {k: v.contiguous() for k, v in timm_model.state_dict().items()}
    save_file(state, path) if fmt == "safetensors" else torch.save(state, path)
    # a 48×48 input with patch 8 has a 6×6 grid, the weights a 4×4 one; 10 classes, not 1000
    model = ViTClassifier(image_size=48, patch_size=8, dim=48, depth=2, heads=3, num_classes=10, pretrained=str(path))
    vit = model.model
    assert vit.pos_embedding.shape == (1, 37, 48) and vit.head.weight.shape == (10, 48)
    torch.testing.assert_close(vit.pos_embedding[:, 0], timm_model.pos_embed[:, 0])  # [cls] position kept
    torch.testing.assert_close(vit.blocks[1].attn.out_proj.weight, timm_model.blocks[1].attn.proj.weight)
    torch.testing.assert_close(vit.cls_token, timm_model.cls_token)
    with pytest.raises(ValueError, match="shape mismatch"):
        ViTClassifier(image_size=48, patch_size=8, dim=48, depth=2, heads=4, mlp_ratio=2.0, pretrained=str(path))
