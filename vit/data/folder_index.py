"""The index of an image folder: the images of each split (``train/``, ``val/``, ``test/``) under their
class, and those that cannot be read. Checking every image (``vit.data.images.check_image``) reads every file;
the index is built that way once per state of the folder, by one process, and kept in a file (by default
``folder_index.json`` in the run folder), which later starts — a resume, a requeued job — reuse. Under
DDP, process 0 alone walks the folder and reads or builds the index; the other processes receive it
(vit.cluster.launch.from_process_zero) and read no image of the training folder until training (each lists ``val/`` and
``test/``).

The state of the folder is the digest of its image files' (path, size, modification time in ns), listed in
one ``os.scandir`` walk: a stat per file, and no file read. Adding, removing, renaming, replacing or
rewriting an image changes it, and the next start checks every image again. An index file that cannot be
read, or that another state of the folder wrote, is rebuilt with one line saying why."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from vit.exits import DatasetError
from vit.data.images import IMAGE_SUFFIXES, check_image

FORMAT = 1  # written in each index; raise it when what check_image refuses changes
NAME = "folder_index.json"
SPLITS = ("train", "val", "test")


@dataclass
class FolderIndex:
    samples: dict[str, list[tuple[str, int]]]  # split (present ones) → (path, class index), as ImageFolder lists them
    bad: dict[str, str]  # path → why it cannot be read
    digest: str  # the folder's state
    built: bool  # whether this start checked the images (False: read from the index file)

    @property
    def images(self) -> int:
        return sum(len(s) for s in self.samples.values())


def _files(folder: str) -> list[tuple[str, str, int, int]]:
    """(directory, name, size, mtime_ns) of the image files under ``folder``, symbolic links followed, as
    os.walk(followlinks=True) finds them. A broken link is listed with size and time -1."""
    out, todo = [], [folder]
    while todo:
        directory = todo.pop()
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.is_dir():
                        todo.append(entry.path)
                    elif os.path.splitext(entry.name)[1].lower() in IMAGE_SUFFIXES:
                        try:
                            st = entry.stat()
                            out.append((directory, entry.name, st.st_size, st.st_mtime_ns))
                        except OSError:
                            out.append((directory, entry.name, -1, -1))
        except OSError as e:
            raise DatasetError(f"cannot list {directory}: {e.strerror or e}") from None
    out.sort(key=lambda f: (f[0], f[1]))  # ImageFolder's order: sorted directories, sorted names in each
    return out


def walk(root: Path, classes: list[str]) -> tuple[dict[str, list[tuple[str, int]]], str]:
    """Each present split's samples in ImageFolder's order, and the digest of the folder's state."""
    digest = hashlib.sha256(json.dumps([FORMAT, classes]).encode())
    # a file's path relative to root is its text after root's (each path below is root / split / ... as
    # text): os.path.relpath's result at a fraction of its cost, for a requeue's start walks every file
    prefix = len(str(root / "x")) - 1
    samples = {}
    for split in SPLITS:
        folder = root / split
        if not folder.is_dir():
            continue
        samples[split] = []
        for target, name in enumerate(classes):
            class_dir = folder / name
            if not class_dir.is_dir():
                continue
            for directory, file, size, mtime in _files(str(class_dir)):
                path = os.path.join(directory, file)
                samples[split].append((path, target))
                digest.update(f"{path[prefix:]}\0{size}\0{mtime}\n".encode(errors="surrogateescape"))
    return samples, digest.hexdigest()


def read(path: Path, digest: str, root: Path, paths: set[str]) -> tuple[dict[str, str] | None, str | None]:
    """The unreadable files an index file records for this state of the folder, or (None, why not)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None, None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"{path} cannot be read as a folder index ({e}): checking every image again"
    bad = data.get("bad") if isinstance(data, dict) else None
    if not (isinstance(data, dict) and data.get("format") == FORMAT and isinstance(data.get("digest"), str)
            and isinstance(bad, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in bad.items())):
        return None, f"{path} is not a folder index this version reads: checking every image again"
    if data["digest"] != digest:
        return None, f"{root} changed since {path} was written: checking every image again"
    absolute = {str(root / rel): why for rel, why in bad.items()}
    if not absolute.keys() <= paths:
        return None, f"{path} names files that {root} does not hold: checking every image again"
    return absolute, None


def write(path: Path, digest: str, root: Path, images: int, bad: dict[str, str]) -> str | None:
    """Write the index atomically (a reader sees the old file or the new one, whole); why not, or None."""
    data = {"format": FORMAT, "root": str(root), "digest": digest, "images": images,
            "bad": {os.path.relpath(p, root): why for p, why in bad.items()}}
    draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        draft.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(draft, path)
    except OSError as e:
        try:
            draft.unlink(missing_ok=True)
        except OSError:
            pass  # (no draft was made)
        return f"cannot write the folder index {path} ({e.strerror or e}): the next start checks every image again"
    return None


def index(root: Path, classes: list[str], path: Path | None, threads: int, say: Callable[[str], None]) -> FolderIndex:
    """The folder's index: read from ``path`` when it was written for this state of the folder, else
    built (every image checked, in ``threads`` threads) and written there. ``say``: one line for the user."""
    samples, digest = walk(root, classes)
    every = [p for split in samples.values() for p, _ in split]
    if path is not None:
        bad, why = read(path, digest, root, set(every))
        if bad is not None:
            return FolderIndex(samples, bad, digest, built=False)
        if why:
            say(why)
    say(f"checking {len(every):,} images in {root}" + (f" (once: {path} keeps the result)" if path else ""))
    with ThreadPoolExecutor(max(1, threads)) as pool:
        reasons = list(pool.map(check_image, every))
    bad = {p: r for p, r in zip(every, reasons) if r is not None}
    if path is not None and (why := write(path, digest, root, len(every), bad)):
        say(why)
    return FolderIndex(samples, bad, digest, built=True)

