"""Validation and test loss are the mean over images, not over batches: a last, smaller batch counts as many
images as it holds."""

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from vit.models.model import ViTConfig
from vit.training.module import ViTClassifier


@pytest.mark.parametrize("stage", ["validate", "test"])
def test_loss_is_the_mean_over_images_with_uneven_batches(stage):
    torch.manual_seed(0)
    module = ViTClassifier(ViTConfig(image_size=8, patch_size=4, num_classes=3, dim=16, depth=1, heads=2))
    images = torch.randint(0, 256, (11, 3, 8, 8), dtype=torch.uint8)
    labels = torch.randint(0, 3, (11,))
    # batches of 8 and 3 images: the mean of the two batches' means differs from the mean over the 11 images
    loader = DataLoader(TensorDataset(images, labels), batch_size=8)
    with torch.no_grad():
        losses = F.cross_entropy(module.eval()(images), labels, reduction="none")
    whole, per_batch = losses.mean().item(), (losses[:8].mean() + losses[8:].mean()).item() / 2
    assert abs(whole - per_batch) > 1e-3  # the data tells the two apart
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    prefix = "val" if stage == "validate" else "test"
    (logged,) = getattr(trainer, stage)(module, dataloaders=loader, verbose=False)
    assert logged[f"{prefix}/loss"] == pytest.approx(whole, abs=1e-5)
