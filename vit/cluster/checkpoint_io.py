"""Atomic checkpoint saves: a draft beside the destination, fsync'd, then renamed over it.

Lightning's fsspec writer stages in the system temp folder and moves the file; when /tmp is on another file system
than the run folder, that move is a copy and a kill during it leaves a torn newest checkpoint. A rename within one
folder is atomic (NFS and Lustre too). A killed save leaves its draft, deleted by ``remove_drafts`` on restart.
Each checkpoint records ``SAVED_AT`` because a copy (``cp -r``) resets file modification times.
"""

from __future__ import annotations

import errno
import io
import os
import re
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

SAVED_AT = "saved_at"
DRAFT = re.compile(r"\.(?P<name>.+)\.(?P<pid>\d+)\.tmp")  # save_atomically's draft of <name>
# a folder fsync that some NFS and FUSE mounts refuse; the rename stands all the same
FSYNC_REFUSED = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EBADF, errno.EACCES,
                 errno.EPERM}


def draft_of(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def remove_drafts(folder: Path) -> list[tuple[str, int]]:
    """Delete drafts of killed saves in ``folder``, returning their names and sizes. Call only where no save
    can be running there: before training, on the process that writes checkpoints."""
    removed = []
    for path in folder.iterdir() if folder.is_dir() else ():
        if DRAFT.fullmatch(path.name) and path.is_file():
            size = path.stat().st_size
            path.unlink(missing_ok=True)
            removed.append((path.name, size))
    return removed


def save_atomically(checkpoint: dict[str, Any], path: str | os.PathLike) -> None:
    """torch.save ``checkpoint`` to ``path``: a temporary file in the same folder, fsync'd, then renamed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = draft_of(path)
    serialized = io.BytesIO()  # torch's zip writer would report a full disk as a RuntimeError without errno
    torch.save(checkpoint, serialized)
    try:
        with open(draft, "wb") as f:
            f.write(serialized.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(draft, path)
    except OSError as e:
        draft.unlink(missing_ok=True)  # the old checkpoint is untouched
        raise OSError(e.errno, e.strerror, str(path)) from e  # (a write's error names no file)
    except BaseException:
        draft.unlink(missing_ok=True)
        raise
    try:
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)  # so the rename itself reaches the disk
        finally:
            os.close(folder)
    except OSError as e:
        if e.errno not in FSYNC_REFUSED:
            raise OSError(e.errno, e.strerror, str(path.parent)) from e


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint I/O, but saving with ``save_atomically`` and stamping ``SAVED_AT``."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        save_atomically({**checkpoint, SAVED_AT: time.time()}, path)
