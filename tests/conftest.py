"""Shared fixtures: small datasets written in CIFAR-10's official on-disk format."""

import logging
import sys
from pathlib import Path

import pytest

from helpers import make_fake_cifar

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def same_torch_threads():
    """Every test starts with the same torch thread count: a command's main() run in this process may set it
    (vit-classify with decoding workers on every core sets 1), and a run's float sums depend on it."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def own_wandb_service(monkeypatch):
    """A W&B run started in this process (a command's main() with W&B on) leaves its service's address in
    WANDB_SERVICE, which every later command started as a subprocess would inherit and use: each test starts
    without it, and it is gone again after the test; so is the settings wandb keeps in this process from its
    first run (the W&B server, the mode), which a later run here would use whatever its environment says."""
    import sys

    monkeypatch.delenv("WANDB_SERVICE", raising=False)
    yield
    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()


class _CurrentStderr(logging.StreamHandler):
    """A stream handler that writes to the sys.stderr of the moment (the running test's capture)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def _follow_stderr() -> None:
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        for handler in logging.getLogger(name).handlers:
            if type(handler) is logging.StreamHandler:
                handler.__class__ = _CurrentStderr


@pytest.fixture(autouse=True)
def lightning_logs_to_this_tests_stderr():
    """Lightning adds a stream handler bound to the sys.stderr of its import, which may be the capture of a test
    that has ended (closed: "--- Logging error ---" in a later test's output): each handler follows sys.stderr."""
    _follow_stderr()
    yield
    _follow_stderr()


@pytest.fixture
def fake_cifar(tmp_path) -> Path:
    return make_fake_cifar(tmp_path / "data")


@pytest.fixture(scope="session")
def fake_cifar_session(tmp_path_factory) -> Path:
    return make_fake_cifar(tmp_path_factory.mktemp("cifar") / "data")


@pytest.fixture(scope="session")
def trained_checkpoint(tmp_path_factory, fake_cifar_session) -> Path:
    """A real checkpoint of vit-train (smoke recipe, 2 epochs on the fake data), made in this process."""
    from helpers import train_here

    cwd = tmp_path_factory.mktemp("trained")
    assert train_here(cwd, fake_cifar_session, "--trainer.max_epochs", "2", "--trainer.logger", "false",
                      "--test_after_fit", "false") == 0
    return cwd / "runs" / "smoke" / "version_0" / "checkpoints" / "last.ckpt"
