"""Shared fixtures: small datasets written in CIFAR-10's official on-disk format."""

import pickle
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def make_fake_cifar(root: Path, per_batch: int = 100, test_size: int = 200, seed: int = 0) -> Path:
    """Write cifar-10-batches-py/ under root: a learnable task (each class has its own colour,
    plus pixel noise), pickled exactly like the official files (dicts of bytes keys)."""
    rng = np.random.default_rng(seed)
    colours = rng.integers(30, 226, size=(10, 3))
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)

    def batch(n, name):
        labels = rng.integers(0, 10, size=n)
        images = colours[labels][:, :, None, None] + rng.normal(0, 30, size=(n, 3, 32, 32))
        data = np.clip(images, 0, 255).astype(np.uint8).reshape(n, 3072)
        return {b"batch_label": name.encode(), b"labels": labels.tolist(), b"data": data,
                b"filenames": [f"{name}_{i:05d}.png".encode() for i in range(n)]}

    for i in range(1, 6):
        with open(folder / f"data_batch_{i}", "wb") as f:
            pickle.dump(batch(per_batch, f"training batch {i} of 5"), f, protocol=2)
    with open(folder / "test_batch", "wb") as f:
        pickle.dump(batch(test_size, "testing batch 1 of 1"), f, protocol=2)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [c.encode() for c in CLASSES], b"num_cases_per_batch": per_batch,
                     b"num_vis": 3072}, f, protocol=2)
    return root


@pytest.fixture(autouse=True)
def same_torch_threads():
    """Every test starts with the same torch thread count: a command's main() run in this process may set it
    (vit-classify with decoding workers on every core sets 1), and a run's float sums depend on it."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def fake_cifar(tmp_path) -> Path:
    return make_fake_cifar(tmp_path / "data")


@pytest.fixture(scope="session")
def fake_cifar_session(tmp_path_factory) -> Path:
    return make_fake_cifar(tmp_path_factory.mktemp("cifar") / "data")


@pytest.fixture(scope="session")
def trained_checkpoint(tmp_path_factory, fake_cifar_session) -> Path:
    """A real checkpoint of vit-train (smoke recipe, 2 epochs on the fake data), made in this process."""
    from test_train import train_here

    cwd = tmp_path_factory.mktemp("trained")
    assert train_here(cwd, fake_cifar_session, "--trainer.max_epochs", "2", "--trainer.logger", "false",
                      "--test_after_fit", "false") == 0
    return cwd / "runs" / "smoke" / "version_0" / "checkpoints" / "last.ckpt"
