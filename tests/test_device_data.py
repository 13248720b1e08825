"""The on-device data path: the same crops and flips as torchvision, per sample, seeded by epoch."""

import pytest
import torch
from torchvision.transforms.v2 import functional as TF

from vit.data.device_data import DeviceBatches, crop_flip, random_crop_flip


def torchvision_reference(image, top, left, flip, padding):
    out = TF.crop(TF.pad(image, [padding], padding_mode="reflect"), top, left, image.shape[-2], image.shape[-1])
    return TF.horizontal_flip(out) if flip else out


@pytest.mark.parametrize("padding", [0, 1, 4])
def test_crop_flip_equals_torchvision_for_the_same_parameters(padding):
    g = torch.Generator().manual_seed(padding)
    images = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8, generator=g)
    tops, lefts = torch.randint(0, 2 * padding + 1, (2, 64), generator=g)
    flips = torch.rand(64, generator=g) < 0.5
    out = crop_flip(images, tops, lefts, flips, padding)
    assert out.dtype == torch.uint8 and out.shape == images.shape
    for i in range(64):
        expected = torchvision_reference(images[i], tops[i].item(), lefts[i].item(), flips[i].item(), padding)
        assert torch.equal(out[i], expected), i


def test_non_square_and_one_channel():
    images = torch.randint(0, 256, (5, 1, 20, 28), dtype=torch.uint8)
    tops, lefts, flips = torch.tensor([0, 8, 3, 4, 8]), torch.tensor([8, 0, 5, 4, 1]), torch.tensor([1, 0, 1, 0, 1]).bool()
    out = crop_flip(images, tops, lefts, flips, 4)
    for i in range(5):
        assert torch.equal(out[i], torchvision_reference(images[i], tops[i].item(), lefts[i].item(), flips[i].item(), 4))


def test_random_parameters_cover_the_range_and_flip_half_the_time():
    # a unique value per pixel lets us read off each sample's offset and flip from its output
    n, padding = 4000, 4
    base = torch.arange(32 * 32, dtype=torch.int64).view(1, 1, 32, 32)
    images = base.expand(n, 1, 32, 32).contiguous()
    out = random_crop_flip(images, padding, generator=torch.Generator().manual_seed(0))
    centre = out[:, 0, 16, 16]  # where pixel (16, 16) came from
    rows, cols = centre // 32, centre % 32
    flipped = out[:, 0, 16, 17] < out[:, 0, 16, 16]
    assert 0.47 < flipped.float().mean().item() < 0.53
    # unflipped: source col = left - p + 16; flipped: source col = left - p + 15; rows: top - p + 16
    offsets = torch.where(flipped, cols - 15, cols - 16) + padding
    assert set((rows - 16 + padding).tolist()) == set(range(2 * padding + 1))
    assert set(offsets.tolist()) == set(range(2 * padding + 1))


def test_device_batches_shard_by_rank_and_seed_by_epoch():
    images = torch.arange(100, dtype=torch.uint8).view(100, 1, 1, 1).expand(100, 3, 8, 8).contiguous()
    labels = torch.arange(100)

    def batches(rank, world, epoch):
        loader = DeviceBatches(images, labels, batch_size=10, seed=0, position=lambda n, per_batch: (epoch, 0), rank=rank,
                               world_size=world, padding=0, hflip=False)
        return torch.cat([y for _, y in loader])

    assert len(DeviceBatches(images, labels, 10, 0, lambda n, per_batch: (0, 0), 0, 2)) == 5
    r0, r1 = batches(0, 2, 0), batches(1, 2, 0)
    assert len(r0) == len(r1) == 50 and not set(r0.tolist()) & set(r1.tolist())  # disjoint shards
    assert torch.equal(batches(0, 2, 0), r0)  # same epoch, same order
    assert not torch.equal(batches(0, 2, 1), r0)  # next epoch, new order
    for x, y in DeviceBatches(images, labels, 10, 0, lambda n, per_batch: (0, 0)):
        assert torch.equal(x[:, 0, 0, 0].long(), y)  # images stay with their labels


def test_device_batches_start_at_any_batch_exactly():
    """A resumed epoch (vit.data.resume): starting at batch k gives exactly batches k, k+1, … of the whole epoch,
    crops and flips included."""
    images = torch.randint(0, 256, (100, 3, 8, 8), dtype=torch.uint8)
    labels = torch.arange(100)

    def epoch(start):
        return list(DeviceBatches(images, labels, 10, 0, lambda n, per_batch: (3, start), rank=1, world_size=2, padding=2))

    whole, tail = epoch(0), epoch(2)
    assert len(whole) == 5 and len(tail) == 3
    for (x, y), (x2, y2) in zip(whole[2:], tail):
        assert torch.equal(x, x2) and torch.equal(y, y2)


def test_mixup_cutmix_targets_sum_to_one():
    from timm.data import Mixup

    mix = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=10)
    for _ in range(10):
        x, targets = mix(torch.rand(8, 3, 32, 32), torch.randint(0, 10, (8,)))
        torch.testing.assert_close(targets.sum(-1), torch.ones(8))


def test_time_to_accuracy_records_each_threshold_once_on_the_runs_clock():
    import time
    from types import SimpleNamespace

    from vit.training.callbacks import TimeToAccuracy
    from vit.training.callbacks import TrainingClock

    logged = {}
    module = SimpleNamespace(log_dict=lambda d: logged.update(d))
    clock = TrainingClock()
    clock.load_state_dict({"training_seconds": 100.0})  # a resumed run: 100 s trained before
    clock.started = time.perf_counter()
    cb = TimeToAccuracy(thresholds=(0.93, 0.90))
    for epoch, acc in enumerate([0.5, 0.91, 0.89, 0.95]):
        trainer = SimpleNamespace(callback_metrics={"val/acc": torch.tensor(acc)}, sanity_checking=False,
                                  current_epoch=epoch, global_step=10 * epoch, callbacks=[cb, clock])
        cb.on_validation_epoch_end(trainer, module)
        if epoch == 1:
            first_90 = logged["time_to/val_acc_0.90"]
            assert "time_to/val_acc_0.93" not in logged
    assert logged["time_to/val_acc_0.90"] == first_90  # not overwritten by later epochs
    assert logged["time_to/val_acc_0.93"] >= first_90 >= 100  # the run's clock, resumed time included
    resumed = TimeToAccuracy(thresholds=(0.93, 0.90))
    resumed.load_state_dict(cb.state_dict())
    assert resumed.reached == cb.reached and resumed.reached_wall == cb.reached_wall
    assert all(logged[f"time_to/wall_val_acc_{t}"] > 0 for t in ("0.90", "0.93"))


def test_time_to_accuracy_counts_the_training_epochs_alone(monkeypatch):
    """Validation's seconds (resumed ones included) are not training seconds; the wall clock counts them. (The
    clock is moved by hand, so the figures are exact on any machine.)"""
    from types import SimpleNamespace

    import vit.training.callbacks as callbacks
    from vit.training.callbacks import TimeToAccuracy, TrainingClock

    now = SimpleNamespace(seconds=500.0)
    monkeypatch.setattr(callbacks, "time", SimpleNamespace(perf_counter=lambda: now.seconds))
    clock = TrainingClock()
    clock.load_state_dict({"training_seconds": 100.0, "validation_seconds": 30.0})
    trainer = SimpleNamespace(sanity_checking=False, callbacks=[clock])
    clock.started = now.seconds
    now.seconds += 5.0  # five seconds of training,
    clock.on_validation_start(trainer, None)
    now.seconds += 0.25  # a quarter of a second of validation
    assert clock.validation_seconds() == 30.25 and clock.train_seconds() == 75.0  # (counted while it runs)
    clock.on_validation_end(trainer, None)
    now.seconds += 1.0  # and another second of training
    assert clock.validation_seconds() == 30.25
    assert clock.train_seconds() == 76.0  # 100 s resumed, 30 of them validation; 6.25 s here, 0.25 validation
    cb = TimeToAccuracy(thresholds=(0.5,))
    logged = {}
    trainer = SimpleNamespace(callback_metrics={"val/acc": torch.tensor(0.6)}, sanity_checking=False,
                              current_epoch=3, global_step=30, callbacks=[cb, clock])
    cb.on_validation_epoch_end(trainer, SimpleNamespace(log_dict=logged.update))
    assert logged["time_to/val_acc_0.50"] == 76.0 and clock.seconds() == 106.25


@pytest.mark.parametrize("world", [1, 3])
def test_validation_on_the_device_reads_every_image_once(world):
    from vit.data.device_data import DeviceEvalBatches

    images = torch.arange(103 * 3 * 2 * 2, dtype=torch.int32).view(103, 3, 2, 2).to(torch.uint8)
    labels = torch.arange(103)
    seen = []
    for rank in range(world):
        batches = DeviceEvalBatches(images, labels, 10, rank, world)
        got = list(batches)
        assert len(got) == len(batches)
        for x, y in got:
            assert torch.equal(x, images[y])  # each image with its own label, as stored
            seen += y.tolist()
    assert sorted(seen) == list(range(103))


def test_device_batches_autoaugment_after_crop_flip_with_each_steps_draws():
    """auto_augment="autoaugment": each batch is the crop+flip batch it would be without (the same crops and
    flips), then AutoAugmented with draws that follow them from the step's generator; and N processes
    together still read, image for image, one process's batch."""
    from vit.data.device_augment import autoaugment, autoaugment_draws
    from vit.data.device_data import crop_flip_draws
    from vit.data.seeding import epoch_seed

    torch.set_num_threads(1)  # many small batches: as fast on a busy machine (conftest restores the count)
    images = torch.randint(0, 256, (100, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    labels = torch.arange(100)

    def epoch(auto_augment, batch_size=10, rank=0, world=1):
        return list(DeviceBatches(images, labels, batch_size, 0, lambda n, per_batch: (2, 0), rank=rank,
                                  world_size=world, padding=4, auto_augment=auto_augment))

    plain, augmented = epoch(None), epoch("autoaugment")
    assert len(plain) == len(augmented) == 10
    changed = 0
    for step, ((x, y), (xa, ya)) in enumerate(zip(plain, augmented)):
        assert torch.equal(y, ya) and xa.dtype == torch.uint8
        g = torch.Generator().manual_seed(epoch_seed(0, 2) * 100_003 + step)
        crop_flip_draws(10, 4, True, torch.device("cpu"), g)
        assert torch.equal(xa, autoaugment(x, autoaugment_draws(10, None, g)))
        changed += int((xa != x).flatten(1).any(1).sum())
    assert changed > 30  # most images get at least one op
    one = epoch("autoaugment", batch_size=20)
    shares = [epoch("autoaugment", batch_size=10, rank=r, world=2) for r in range(2)]
    for (x, y), (x0, y0), (x1, y1) in zip(one, *shares):
        order = torch.cat([y0, y1]).argsort()
        assert torch.equal(torch.cat([x0, x1])[order], x[y.argsort()])
    with pytest.raises(ValueError, match="autoaugment"):
        DeviceBatches(images, labels, 10, 0, lambda n, per_batch: (0, 0), auto_augment="randaugment")
