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


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=[pytest.mark.long, pytest.mark.lowest])],
                         ids=["eager", "compiled"])
def test_training_loss_and_accuracy_are_over_images_with_uneven_batches(compiled):
    """train/loss and train/acc of an epoch: the mean over its images (a last, smaller batch counts as many
    images as it holds), as the step's own sums (vit.training.module.step_loss) add up on the device, eager and
    in the compiled graph of a compiled recipe."""
    torch.manual_seed(0)
    module = ViTClassifier(ViTConfig(image_size=8, patch_size=4, num_classes=3, dim=16, depth=1, heads=2),
                           compile=compiled)
    with torch.no_grad():  # logits far apart: each image's loss its own, on any torch's initialisation
        module.model.head.weight.mul_(20)
    module.configure_optimizers = lambda: torch.optim.SGD(module.parameters(), lr=0.0)
    images = torch.randint(0, 256, (11, 3, 8, 8), dtype=torch.uint8)
    labels = torch.randint(0, 3, (11,))
    with torch.no_grad():  # the model never moves (lr 0): the epoch's values are its values on the set
        logits = module.model(module.normalize(images))
    losses = F.cross_entropy(logits, labels, reduction="none")
    whole, per_batch = losses.mean().item(), (losses[:8].mean() + losses[8:].mean()).item() / 2
    assert abs(whole - per_batch) > 1e-3  # the data tells the two apart
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, max_epochs=1, num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(module, train_dataloaders=DataLoader(TensorDataset(images, labels), batch_size=8))
    logged = trainer.callback_metrics
    assert logged["train/loss"].item() == pytest.approx(whole, abs=1e-4)
    assert logged["train/acc"].item() == pytest.approx((logits.argmax(-1) == labels).float().mean().item())
