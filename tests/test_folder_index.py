"""An image folder's index (vit.data.folder_index): built once per state of the folder, reused by later starts
without opening an image, rebuilt when a file is added, removed or rewritten, or when the index file is
not one this version wrote for this state."""

import json
import logging
import os
from pathlib import Path

import pytest
from PIL import Image

import vit.data.folder_index
from vit.data.datamodules import DatasetError, ImageFolderDataModule
from helpers import write_bad_files, write_images


@pytest.fixture
def folders(tmp_path):
    write_images(tmp_path / "photos" / "train" / "red", 6, (200, 20, 20), size=16)
    write_images(tmp_path / "photos" / "train" / "blue", 6, (20, 20, 200), size=16)
    write_bad_files(tmp_path / "photos" / "train" / "red")
    return tmp_path / "photos"


@pytest.fixture
def opened(monkeypatch):
    """How many images were checked and how many files PIL opened since the test began."""
    counts = {"checked": 0, "opened": 0}
    check, pil_open = vit.data.folder_index.check_image, Image.open

    def counting_check(path):
        counts["checked"] += 1
        return check(path)

    def counting_open(*args, **kwargs):
        counts["opened"] += 1
        return pil_open(*args, **kwargs)

    monkeypatch.setattr(vit.data.folder_index, "check_image", counting_check)
    monkeypatch.setattr(Image, "open", counting_open)
    return counts


def start(root, index, **kwargs):
    """A start of the data module (its setup, as every process's start does); returns it."""
    dm = ImageFolderDataModule(root=str(root), image_size=16, num_workers=0, val_size=2, index=str(index), **kwargs)
    dm.setup("fit")
    return dm


def listing(dm):
    return [path for path, _ in dm.train_set.dataset.samples], sorted(dm.bad_files)


def test_a_second_start_reads_no_image_and_finds_what_the_first_found(folders, tmp_path, opened):
    first = start(folders, tmp_path / "index.json")
    assert opened["checked"] == 15 and opened["opened"] >= 12  # every image checked: 12 good, 3 bad
    assert sorted(os.path.basename(p) for p in first.bad_files) == ["empty.png", "notes.png", "truncated.jpg"]
    opened.update(checked=0, opened=0)
    second = start(folders, tmp_path / "index.json")
    assert opened == {"checked": 0, "opened": 0}
    assert listing(second) == listing(first)
    assert [second.train_set.dataset.targets[i] for i in second.train_set.indices] == \
        [first.train_set.dataset.targets[i] for i in first.train_set.indices]
    written = json.loads((tmp_path / "index.json").read_text())
    assert written["images"] == 15 and sorted(written["bad"]) == ["train/red/empty.png", "train/red/notes.png",
                                                                   "train/red/truncated.jpg"]


@pytest.mark.parametrize("change", ["add", "remove", "rewrite", "touch"])
def test_a_changed_folder_is_checked_again(folders, tmp_path, opened, change):
    start(folders, tmp_path / "index.json")
    image = folders / "train" / "blue" / "1.jpg"
    if change == "add":
        write_images(folders / "train" / "blue" / "more", 2, (20, 20, 200), size=16)
    elif change == "remove":
        image.unlink()
    elif change == "rewrite":  # the same path, now damaged: it must be found unreadable, before training
        image.write_bytes(image.read_bytes()[:40])
    else:  # the same bytes written again: only the time changed
        stat = image.stat()
        os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    opened.update(checked=0)
    dm = start(folders, tmp_path / "index.json")
    images = {"add": 17, "remove": 14}.get(change, 15)
    assert opened["checked"] == images
    assert len(dm.train_set) + len(dm.val_set) + len(dm.bad_files) == images
    assert (str(image) in dm.bad_files) == (change == "rewrite")
    opened.update(checked=0)
    start(folders, tmp_path / "index.json")
    assert opened["checked"] == 0  # and the new state is kept in its turn


@pytest.mark.parametrize("content, why", [
    (b"\x00\xffnot json", "cannot be read as a folder index"),
    (b'{"format": 1, "digest": 7, "bad": {}}', "is not a folder index this version reads"),
    (b"[1, 2]", "is not a folder index this version reads"),
    (b'{"format": 999, "digest": "x", "bad": {}}', "is not a folder index this version reads"),
])
def test_a_damaged_index_is_rebuilt_with_one_line(folders, tmp_path, opened, caplog, content, why):
    (tmp_path / "index.json").write_bytes(content)
    caplog.set_level(logging.INFO)
    dm = start(folders, tmp_path / "index.json")
    assert opened["checked"] == 15 and len(dm.bad_files) == 3
    said = [r.getMessage() for r in caplog.records if "index" in r.getMessage() and "checking every" in r.getMessage()]
    assert len(said) == 1 and why in said[0], said
    assert json.loads((tmp_path / "index.json").read_text())["format"] == vit.data.folder_index.FORMAT


def test_an_index_naming_files_the_folder_lacks_is_rebuilt(folders, tmp_path, opened, caplog):
    """Right digest, wrong list (a crafted file): the images are checked again, not trusted."""
    start(folders, tmp_path / "index.json")
    written = json.loads((tmp_path / "index.json").read_text())
    written["bad"] = {"../../etc/passwd": "crafted"}
    (tmp_path / "index.json").write_text(json.dumps(written))
    opened.update(checked=0)
    caplog.set_level(logging.INFO)
    dm = start(folders, tmp_path / "index.json")
    assert opened["checked"] == 15 and len(dm.bad_files) == 3
    assert any("names files that" in r.getMessage() for r in caplog.records)


def test_the_index_of_another_folder_is_not_taken(folders, tmp_path, opened):
    other = tmp_path / "other"
    write_images(other / "train" / "red", 4, (200, 20, 20), size=16)
    write_images(other / "train" / "blue", 4, (20, 20, 200), size=16)
    start(other, tmp_path / "index.json")
    opened.update(checked=0)
    dm = start(folders, tmp_path / "index.json")
    assert opened["checked"] == 15 and len(dm.bad_files) == 3


def test_on_bad_file_error_stops_at_a_start_that_reads_the_index(folders, tmp_path, opened):
    start(folders, tmp_path / "index.json")
    opened.update(checked=0)
    with pytest.raises(DatasetError, match=r"3 of 15 images .* cannot be read"):
        start(folders, tmp_path / "index.json", on_bad_file="error")
    assert opened["checked"] == 0


def test_an_index_that_cannot_be_written_is_said_and_the_run_goes_on(folders, tmp_path, caplog):
    (tmp_path / "file").write_text("")
    caplog.set_level(logging.INFO)
    dm = start(folders, tmp_path / "file" / "index.json")
    assert len(dm.bad_files) == 3
    assert any("cannot write the folder index" in r.getMessage() for r in caplog.records)


def test_the_index_lists_images_in_image_folders_order(folders):
    """The samples (and so every seeded order and split) are torchvision's ImageFolder's."""
    from torchvision.datasets import ImageFolder

    write_images(folders / "train" / "red" / "deeper", 3, (200, 20, 20), size=16)
    (folders / "train" / "red" / "readme.txt").write_text("not an image")
    samples, _ = vit.data.folder_index.walk(folders, ["blue", "red"])
    theirs = ImageFolder(str(folders / "train"), is_valid_file=lambda p: p.lower().endswith(
        tuple(vit.data.folder_index.IMAGE_SUFFIXES)))
    assert samples["train"] == theirs.samples and len(samples["train"]) == 18 and list(samples) == ["train"]


def test_a_process_waiting_for_process_zeros_index_says_so_until_it_comes(capsys):
    """The other processes of a run wait for process 0's folder index (a first start checks every image):
    each says so at every interval (a minute in a run), and stops saying it once the index came."""
    import time

    from vit.cluster.launch import _Every

    waiting = _Every(0.05, "process 1: still waiting for process 0's folder index")
    lines, deadline = [], time.monotonic() + 30
    while len(lines) < 2 and time.monotonic() < deadline:  # (however loaded the machine)
        time.sleep(0.05)
        lines += capsys.readouterr().err.splitlines()
    waiting.stop()
    lines += capsys.readouterr().err.splitlines()
    assert len(lines) >= 2 and all(line.startswith("process 1: still waiting for process 0's folder index (")
                                   for line in lines), lines
    time.sleep(0.2)
    assert capsys.readouterr().err == ""


def relpath_digest(root, classes):
    """The folder's state as its first version hashed it, each path through os.path.relpath: an index file
    written then stays valid."""
    import hashlib
    import json

    samples, _ = vit.data.folder_index.walk(root, classes)
    digest = hashlib.sha256(json.dumps([vit.data.folder_index.FORMAT, classes]).encode())
    for path, _ in (sample for split in samples.values() for sample in split):
        st = os.stat(path)
        digest.update(f"{os.path.relpath(path, root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def test_the_state_is_the_same_however_the_folder_is_named_and_changes_with_a_file(folders, tmp_path, monkeypatch):
    """The digest hashes each file's path relative to the folder, as os.path.relpath gives it: the folder
    named absolutely, relatively, from inside, with .. in it, through a symbolic link, or copied elsewhere
    with its times, is one state; a renamed file is another."""
    import shutil

    classes = ["blue", "red"]
    _, digest = vit.data.folder_index.walk(folders, classes)
    assert digest == relpath_digest(folders, classes)
    (tmp_path / "link").symlink_to(folders, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    names = [vit.data.folder_index.walk(p, classes)[1] for p in (Path("photos"), Path("link/../photos"), Path("link"))]
    monkeypatch.chdir(folders)
    names.append(vit.data.folder_index.walk(Path("."), classes)[1])
    shutil.copytree(folders, tmp_path / "copied" / "photos")  # (copy2: times kept)
    names.append(vit.data.folder_index.walk(tmp_path / "copied" / "photos", classes)[1])
    assert names == [digest] * 5
    red = folders / "train" / "red"
    first = sorted(red.glob("*.png"))[0]
    first.rename(first.with_name("renamed.png"))
    assert vit.data.folder_index.walk(folders, classes)[1] != digest == relpath_digest(tmp_path / "copied" / "photos", classes)
