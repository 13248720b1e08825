"""Writing checkpoints: each one atomically, inside its own folder.

Lightning's ``TorchCheckpointIO`` writes through fsspec, whose local "transaction" writes a temporary file in
the system's temp folder and then moves it. When the run folder is on another file system (scratch, NFS,
Lustre, with /tmp local to the node) that move is a copy: a kill during it leaves a torn file as the newest
checkpoint, node-local /tmp may be too small, and every save is written twice. Here the checkpoint is
written to a temporary file beside its destination, flushed to the disk, and renamed over it (a rename
within one folder is atomic on POSIX file systems, NFS and Lustre included): the destination is the old
checkpoint or the new one, never a part. A save that fails (a full disk, a kill) leaves the old one; a
kill leaves its draft (``.<name>.<pid>.tmp``), which ``remove_drafts`` deletes when the run starts again.

Each checkpoint records when it was saved (``SAVED_AT``, seconds since the epoch): a copy (``cp -r``)
resets the files' modification times, not that.
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
# a folder fsync refused by the file system (some network and FUSE file systems): the rename is done
FSYNC_REFUSED = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EBADF, errno.EACCES,
                 errno.EPERM}


def draft_of(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def remove_drafts(folder: Path) -> list[tuple[str, int]]:
    """Delete the drafts that killed saves left in ``folder`` (their names and sizes). Call it only where no
    save can be under way in that folder: before a run's training starts, on the one process that writes
    checkpoints."""
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
        draft.unlink(missing_ok=True)  # nothing half-written stays behind; the old checkpoint is untouched
        raise OSError(e.errno, e.strerror, str(path)) from e  # (a write's error names no file)
    except BaseException:
        draft.unlink(missing_ok=True)
        raise
    try:
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)  # the rename itself reaches the disk
        finally:
            os.close(folder)
    except OSError as e:
        if e.errno not in FSYNC_REFUSED:
            raise OSError(e.errno, e.strerror, str(path.parent)) from e
        # the file system does not sync folders (EINVAL on some NFS and FUSE mounts): the checkpoint is in place


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint I/O plugin with ``save_atomically``, each checkpoint stamped with the time it
    was saved (``SAVED_AT``); loading and removing are Lightning's."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        save_atomically({**checkpoint, SAVED_AT: time.time()}, path)
