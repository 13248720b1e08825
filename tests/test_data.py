"""CIFAR-10 data module: official format, validation of every file, safe unpickling, download."""

import hashlib
import http.server
import pickle
import shutil
import tarfile
import threading
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision.transforms import v2

from vit.data.cifar import CLASSES
from vit.data.datamodules import CIFAR10DataModule, DatasetError, augmentation, stratified_split
from helpers import make_fake_cifar


def test_loads_official_format_with_stratified_seeded_split(fake_cifar):
    dm = CIFAR10DataModule(root=str(fake_cifar), val_size=100, num_workers=0, batch_size=32)
    dm.setup("fit")
    assert dm.classes == list(CLASSES) and dm.num_classes == 10
    assert len(dm.train_set) == 400 and len(dm.val_set) == 100
    assert not set(dm.train_set.indices.tolist()) & set(dm.val_set.indices.tolist())
    images, labels = next(iter(dm.train_dataloader()))
    assert images.dtype == torch.uint8 and images.shape == (32, 3, 32, 32) and labels.dtype == torch.int64
    dm.setup("test")
    assert len(dm.test_set) == 200
    again = CIFAR10DataModule(root=str(fake_cifar), val_size=100, num_workers=0)
    again.setup("fit")
    assert torch.equal(again.val_set.indices, dm.val_set.indices)  # seeded


def test_stratified_split_keeps_class_shares():
    labels = torch.arange(10).repeat_interleave(torch.tensor([500] * 5 + [300] * 5))
    train_idx, val_idx = stratified_split(labels, val_size=400, seed=3)
    assert len(val_idx) == 400 and len(train_idx) == len(labels) - 400
    counts = torch.bincount(labels[val_idx], minlength=10)
    assert counts[:5].tolist() == [50] * 5 and counts[5:].tolist() == [30] * 5
    assert not torch.equal(stratified_split(labels, 400, seed=4)[1], val_idx)


def test_pixels_are_read_in_the_official_plane_order(tmp_path):
    root = make_fake_cifar(tmp_path)
    raw = pickle.load(open(root / "cifar-10-batches-py" / "data_batch_1", "rb"), encoding="bytes")
    dm = CIFAR10DataModule(root=str(root), val_size=1, num_workers=0)
    dm.setup("fit")
    first = dm.train_set.dataset.images[0]
    assert torch.equal(first[1, 2, 3], torch.tensor(raw[b"data"][0][1024 + 2 * 32 + 3]))  # G plane, row 2, col 3


def _rewrite(path: Path, **changes):
    batch = pickle.load(open(path, "rb"), encoding="bytes")
    batch.update({k.encode(): v for k, v in changes.items()})
    pickle.dump(batch, open(path, "wb"), protocol=2)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: p.write_bytes(p.read_bytes()[:1000]), "not a valid CIFAR batch file"),
        (lambda p: p.write_bytes(b""), "not a valid CIFAR batch file"),
        (lambda p: _rewrite(p, data=np.zeros((100, 100), np.uint8)), "'data' must be a uint8 array N×3072"),
        (lambda p: _rewrite(p, data=np.zeros((100, 3072), np.float32)), "'data' must be a uint8 array"),
        (lambda p: _rewrite(p, labels=[0] * 99), "'labels' must be a list of 100 integers"),
        (lambda p: _rewrite(p, labels=[12] * 100), r"labels must lie in \[0, 10\)"),
        (lambda p: pickle.dump([1, 2], open(p, "wb")), "expected a pickled dict"),
    ],
)
def test_malformed_batch_is_a_clear_error_naming_the_file(fake_cifar, damage, message):
    path = fake_cifar / "cifar-10-batches-py" / "data_batch_3"
    damage(path)
    dm = CIFAR10DataModule(root=str(fake_cifar), val_size=100, num_workers=0)
    with pytest.raises(DatasetError, match=message) as err:
        dm.setup("fit")
    assert "data_batch_3" in str(err.value)


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os
        return (os.system, (f"touch {self.marker}",))


def test_crafted_pickle_does_not_execute(fake_cifar, tmp_path):
    marker = tmp_path / "pwned"
    path = fake_cifar / "cifar-10-batches-py" / "data_batch_2"
    batch = pickle.load(open(path, "rb"), encoding="bytes")
    batch[b"payload"] = _Exploit(marker)
    pickle.dump(batch, open(path, "wb"), protocol=2)
    # the same file does run code through a plain pickle.load: the test would catch a regression
    with pytest.raises(DatasetError, match="forbidden global"):
        CIFAR10DataModule(root=str(fake_cifar), val_size=100, num_workers=0).setup("fit")
    assert not marker.exists()
    pickle.load(open(path, "rb"), encoding="bytes")
    assert marker.exists()


def test_missing_data_without_download_says_where_to_put_it(tmp_path):
    dm = CIFAR10DataModule(root=str(tmp_path / "nowhere"), download=False)
    with pytest.raises(DatasetError, match="cifar-10-batches-py"):
        dm.prepare_data()


def test_unreachable_host_is_one_clear_message(tmp_path, monkeypatch):
    monkeypatch.setattr(CIFAR10DataModule, "url", "http://127.0.0.1:9/cifar-10-python.tar.gz")
    dm = CIFAR10DataModule(root=str(tmp_path / "data"))
    with pytest.raises(DatasetError) as err:
        dm.prepare_data()
    msg = str(err.value)
    assert "could not be downloaded" in msg and "cifar-10-batches-py" in msg and "--data.root" in msg


@pytest.fixture
def archive_server(tmp_path):
    """Serve a real cifar-10-python.tar.gz (of the fake data) over HTTP on localhost."""
    src = make_fake_cifar(tmp_path / "src")
    served = tmp_path / "served"
    served.mkdir()
    archive = served / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/cifar-10-python.tar.gz", hashlib.md5(archive.read_bytes()).hexdigest()
    server.shutdown()


def test_download_verifies_md5_and_refetches_a_corrupt_archive(tmp_path, archive_server, monkeypatch):
    url, md5 = archive_server
    monkeypatch.setattr(CIFAR10DataModule, "url", url)
    monkeypatch.setattr(CIFAR10DataModule, "archive_md5", md5)
    root = tmp_path / "data"
    root.mkdir()
    (root / "cifar-10-python.tar.gz").write_bytes(b"half a download")  # a partial earlier download
    dm = CIFAR10DataModule(root=str(root), val_size=100, num_workers=0)
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.train_set) == 400 and dm.classes == list(CLASSES)
    assert hashlib.md5((root / "cifar-10-python.tar.gz").read_bytes()).hexdigest() == md5
    # an archive whose md5 never matches is an error, not silently used
    shutil.rmtree(root / "cifar-10-batches-py")
    monkeypatch.setattr(CIFAR10DataModule, "archive_md5", "0" * 32)
    with pytest.raises(DatasetError, match="could not be downloaded"):
        CIFAR10DataModule(root=str(root)).prepare_data()


def test_augmentations_are_uint8_and_configurable():
    images = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8)
    for policy in (None, "autoaugment", "randaugment-2-9", "trivialaugment"):
        out = v2.Compose(augmentation(4, True, policy, 32))(images)
        assert out.dtype == torch.uint8 and out.shape == (3, 32, 32)
    with pytest.raises(ValueError, match="auto_augment must be"):
        CIFAR10DataModule(auto_augment="autoaugmnt")


def test_the_device_pipeline_takes_autoaugment_and_refuses_what_it_cannot_do_in_one_line():
    from vit.exits import ConfigError

    assert CIFAR10DataModule(pipeline="device", auto_augment="autoaugment").auto_augment == "autoaugment"
    for policy in ("randaugment", "randaugment-2-9", "trivialaugment"):
        with pytest.raises(ConfigError, match=rf"^pipeline 'device' applies auto_augment autoaugment \(or none\), "
                                              rf"not {policy}: use pipeline 'workers' for it$"):
            CIFAR10DataModule(pipeline="device", auto_augment=policy)
    with pytest.raises(ConfigError, match=r"^pipeline 'device' takes CIFAR-10's 32×32 images as stored, not resized "
                                          r"to image_size 24: use pipeline 'workers' for resizing$"):
        CIFAR10DataModule(pipeline="device", image_size=24)


def test_real_cifar10_loads_when_present():
    root = Path(__file__).resolve().parents[2] / "shared" / "data"
    if not (root / "cifar-10-batches-py" / "test_batch").exists():
        pytest.skip("real CIFAR-10 not present (../shared/data)")
    dm = CIFAR10DataModule(root=str(root), num_workers=0)
    dm.setup(None)
    assert len(dm.train_set) == 45000 and len(dm.val_set) == 5000 and len(dm.test_set) == 10000
    assert torch.bincount(dm.test_set.labels).tolist() == [1000] * 10
    assert torch.bincount(dm.val_set.dataset.labels[dm.val_set.indices]).tolist() == [500] * 10
    mean = dm.train_set.dataset.images.float().mean((0, 2, 3)) / 255
    torch.testing.assert_close(mean, torch.tensor([0.4914, 0.4822, 0.4465]), atol=1e-3, rtol=0)


@pytest.mark.parametrize("pipeline, auto_augment", [("workers", None), ("device", None), ("device", "autoaugment")])
def test_n_processes_read_the_images_of_one_step_of_one_process(fake_cifar, pipeline, auto_augment):
    """--data.batch_size is the global batch: each of N processes takes 1/N of it, and in every step the N
    shares together are exactly one process's batch, augmentations included (per-image draws depend on
    the image's place in the epoch, never on the rank), from a mid-epoch resume too."""
    from types import SimpleNamespace

    if auto_augment:
        torch.set_num_threads(1)  # many small batches: as fast on a busy machine (conftest restores the count)

    def steps(world: int, rank: int, epoch: int = 1, start: int = 0) -> list[list[tuple[int, bytes]]]:
        dm = CIFAR10DataModule(root=str(fake_cifar), val_size=100, num_workers=0, batch_size=40, pipeline=pipeline,
                               auto_augment=auto_augment)
        dm.trainer = SimpleNamespace(world_size=world, global_rank=rank, accumulate_grad_batches=1,
                                     lightning_module=None, strategy=SimpleNamespace(root_device=torch.device("cpu")))
        dm.setup("fit")
        dm.position.epochs, dm.position.resume_at = epoch, (epoch, 40 * start, 0) if start else None
        return [sorted((int(y), x.numpy().tobytes()) for x, y in zip(*batch)) for batch in dm.train_dataloader()]

    one = steps(1, 0)
    assert len(one) == 400 // 40 and all(len(batch) == 40 for batch in one)
    for world in (2, 4):
        shares = [steps(world, rank) for rank in range(world)]
        assert all(len(s) == len(one) and all(len(batch) == 40 // world for batch in s) for s in shares)
        for i, batch in enumerate(one):
            assert sorted(sum((s[i] for s in shares), [])) == batch, (world, i)
    resumed = [steps(2, rank, start=3) for rank in range(2)]  # a resume at step 3 of the epoch, on 2 processes
    assert [sorted(a + b) for a, b in zip(*resumed)] == one[3:]


def test_the_global_batch_splits_evenly_and_usefully_or_says_why():
    from vit.data.datamodules import MIN_SHARE, split_batch
    from vit.exits import ConfigError

    assert split_batch(512, 1) == 512 and split_batch(512, 16) == 32 and split_batch(5, 1) == 5
    with pytest.raises(ConfigError, match=r"--data.batch_size 100 is the global batch and must divide among the 8 "
                                          r"processes of this run: use a multiple of 8, e.g. 96 or 104"):
        split_batch(100, 8)
    with pytest.raises(ConfigError, match=rf"split among 16 processes is 4 images per process and step, fewer than "
                                          rf"{MIN_SHARE}.*Raise --data.batch_size to {16 * MIN_SHARE}"):
        split_batch(64, 16)


def test_val_size_as_a_fraction_is_written_as_given_and_a_bad_one_is_one_line(tmp_path, monkeypatch, capsys):
    """The run's saved config (and --print_config) keeps a fractional val_size (a union of jsonargparse's
    restricted types wrote the default 0.1 as 0, so a run started again from its config.yaml failed); a
    val_size that is neither a count nor a fraction in (0, 1) is exit 2 with one line. vit-train's main() in
    this process (the 6 subprocesses' start-up is what these would cost)."""
    from vit.commands.train import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    for given in ("0.1", "0.25", "5000"):
        with pytest.raises(SystemExit) as stop:
            main(["--config", "smoke", "--data.val_size", given, "--print_config"])
        printed = capsys.readouterr()
        assert stop.value.code == 0 and f"val_size: {given}\n" in printed.out, printed.err[-2000:]
    for bad in ("1.5", "0", "-3"):
        code = main(["--config", "smoke", "--data.root", str(tmp_path), "--data.val_size", bad])
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(errors) == 1 and "val_size" in errors[0], err[-2000:]
        assert "Traceback" not in err
