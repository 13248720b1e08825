"""One launch at a time trains in a run folder, on every node and file system.

Process 0 holds ``<run>/.lock`` for its whole fit: a POSIX ``lockf`` lock (freed however the process ends) and a
record whose heartbeat a thread rewrites every ``HEARTBEAT_SECONDS``. Where the lock cannot be seen (no locking, or
node-local locks seen from another host), a heartbeat younger than ``STALE_SECONDS`` counts as held. A start on a
held folder fails before touching it, unless the holder is an earlier attempt of the same launch (a requeue).
Only process 0 takes or reads it (it hands the others its decision), and only this module opens the file:
closing any descriptor of it drops the lock. vit-sync skips held folders.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import socket
import struct
import threading
from datetime import datetime, timezone
from pathlib import Path

from vit.cluster import launch
from vit.exits import RunError

LOCK = ".lock"
UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)  # a file system that does not lock
HEARTBEAT_SECONDS = 60.0
STALE_SECONDS = 300.0  # five missed beats: the holder has ended
_held: dict[Path, int] = {}  # run folder → descriptor holding its lock
_beating: dict[Path, tuple[threading.Event, threading.Thread]] = {}  # run folder → heartbeat thread


def identity() -> str:
    """``<launch name, else pid>/<restart count>``: this attempt of this launch, alike in all its processes."""
    return f"{launch.launch_name() or f'pid-{os.getpid()}'}/{launch.attempt()}"


def _launch(holder: dict) -> tuple[str, str]:
    """(launch name, attempt) of a record."""
    name, _, attempt = str(holder.get("launch", "")).rpartition("/")
    return name, attempt


def describe(holder: dict) -> str:
    """A holder as one phrase: pid 123 on node1 (SLURM job 45_0), since 2026-01-01T00:00:00+00:00."""
    job = f" (SLURM job {holder['slurm_job']})" if holder.get("slurm_job") else ""
    return f"pid {holder.get('pid')} on {holder.get('host')}{job}, since {holder.get('since')}"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def heartbeat_age(holder: dict) -> float | None:
    """Seconds since ``holder`` last wrote its heartbeat, by this machine's clock; None when it names none."""
    try:
        beat = datetime.fromisoformat(holder["heartbeat"])
    except (KeyError, TypeError, ValueError):
        return None
    beat = beat if beat.tzinfo is not None else beat.replace(tzinfo=timezone.utc)  # (naive: another tool's)
    return max(0.0, (datetime.now(timezone.utc) - beat).total_seconds())


def _read(fd: int) -> dict:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:  # another tool's, or cut short
        return {}
    return holder if isinstance(holder, dict) else {}


def _refused(run: Path, holder: dict, locked: bool | None = True) -> RunError:
    who = f" ({describe(holder)})" if holder else ""
    age = heartbeat_age(holder)
    seen = "" if locked or age is None else (
        f"; its lock is not seen from here, its heartbeat is {age:.0f} s old: if that process has ended, the folder "
        f"is free in {max(0.0, STALE_SECONDS - age):.0f} s, or at once once you remove {Path(run) / LOCK}")
    return RunError(f"{run} is in use: another process trains in it{who}, and one process at a time trains in a run "
                    f"folder{seen}. Wait for it to end, or train in another folder (--run NAME)")


def live(holder: dict, locked: bool | None, stale: float = STALE_SECONDS) -> bool:
    """Whether ``holder`` still trains: its lock is held, or, where the lock cannot be seen from here (``locked``
    None: no locking; or a holder on another host), its heartbeat is younger than ``stale`` seconds."""
    if locked:
        return True
    age = heartbeat_age(holder)
    unseen = locked is None or holder.get("host") != socket.gethostname()
    return unseen and age is not None and age < stale


def make(folder: Path, claimed: list[Path]) -> None:
    """Create ``folder`` and its missing parents; those this call created go into ``claimed``, outermost first."""
    for level in (*reversed(folder.parents), folder):
        try:
            if not level.is_dir():  # (mkdir may refuse a folder that exists: EACCES on autofs, on NFS)
                level.mkdir()
                claimed.append(level)
        except FileExistsError:
            if not level.is_dir():
                raise RunError(f"{level} is not a folder (a link to one that is gone?): a run cannot be made in "
                               f"it") from None


def take(run: Path, heartbeat: float = HEARTBEAT_SECONDS, claimed: list[Path] | None = None) -> str | None:
    """Hold ``run``'s lock until ``release`` or exit, with a heartbeat thread; RunError naming the holder when
    another launch holds it (an earlier attempt of this launch is taken over). Folders it makes go into
    ``claimed``. Returns a line to print (a dead holder taken over, or a file system that cannot lock: the
    heartbeat still guards the folder) or None. A Ctrl-C or a stop signal waits until it has returned or raised."""
    run = Path(run)
    if run in _held:
        return None
    with _signals_deferred():
        for _ in range(10):  # (a failed start of this run removes the folder it made as it ends, the lock file last)
            fd = None
            try:
                make(run, [] if claimed is None else claimed)
                fd = os.open(run / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
                said = _lock(run, fd)
                if os.path.samestat(os.fstat(fd), os.stat(run / LOCK)):  # (not a file removed since it was opened)
                    return _hold(run, fd, said, heartbeat)
            except OSError as e:
                if e.errno == errno.ELOOP:  # (O_NOFOLLOW; a loop of links above it is no folder: ``make``)
                    raise RunError(f"{run / LOCK} is a link, not a lock file: remove it") from None
                if e.errno not in (errno.ENOENT, errno.ESTALE):  # (removed here, or on another node of an NFS mount)
                    raise
            finally:
                if fd is not None and _held.get(run) != fd:
                    os.close(fd)  # (drops a lock just taken: refused, failed, or removed meanwhile)
        raise RunError(f"{run / LOCK}: removed or replaced each of 10 times this start took it; start again")


@contextlib.contextmanager
def _signals_deferred():
    """Ctrl-C and SIGUSR1 (a stop) act as the block ends, not between taking a lock and recording it."""
    caught = []
    kinds = [kind for kind in (signal.SIGINT, signal.SIGUSR1) if signal.getsignal(kind) is not None] \
        if threading.current_thread() is threading.main_thread() else []  # (None: a handler set outside Python)
    handlers = {kind: signal.signal(kind, lambda signum, frame: caught.append(signum)) for kind in kinds}
    try:
        yield
    finally:
        for kind, handler in handlers.items():
            signal.signal(kind, handler)
        for kind in caught:
            signal.raise_signal(kind)


def _hold(run: Path, fd: int, said: str | None, heartbeat: float) -> str | None:
    """Write this process's record into the locked ``fd`` and start its heartbeat, unless the record there names
    a live holder of another launch (RunError). Registered last: what ``release`` finds it holds, it gives up."""
    previous = _read(fd)
    (name, ours), (theirs, attempt) = _launch({"launch": identity()}), _launch(previous)
    if (theirs != name or attempt == ours) and live(previous, None if said else False):
        raise _refused(run, previous, locked=False)  # (nothing was written)
    mine = {"launch": identity(), "pid": os.getpid(), "host": socket.gethostname(),
            "slurm_job": launch.slurm_job(), "since": _now()}
    _write(fd, mine)
    if said is None and previous:  # a release empties the file: this holder died holding it
        said = (f"took over {run}: its lock file names {describe(previous)}, which holds it no longer (it ended "
                f"without releasing it, or the folder was copied)")
    stop = threading.Event()
    beat = threading.Thread(target=_beat, args=(fd, mine, heartbeat, stop), name=f"heartbeat {run}", daemon=True)
    beat.start()
    _beating[run] = (stop, beat)
    _held[run] = fd
    return said


def holds(run: Path) -> bool:
    """Whether this process holds ``run``'s lock."""
    return Path(run) in _held


def _lock(run: Path, fd: int) -> str | None:
    """Lock ``fd``; RunError naming the holder if another process holds it; a line to print if the file system
    cannot lock, else None."""
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EAGAIN):
            raise _refused(run, _read(fd)) from None
        if e.errno not in UNSUPPORTED:
            raise
        return (f"the file system of {run} does not lock files ({errno.errorcode[e.errno]}): this run's record and "
                f"heartbeat in {LOCK} keep later starts and vit-sync away (two starts within the same second both "
                f"train)")
    return None


def _write(fd: int, holder: dict) -> None:
    """Write ``holder`` with a fresh heartbeat as the whole file, fsync'd for readers on other nodes, through the
    lock's own descriptor (closing another one would drop the lock)."""
    data = (json.dumps({**holder, "heartbeat": _now()}) + "\n").encode()
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))
    os.fsync(fd)


def _beat(fd: int, holder: dict, seconds: float, stop: threading.Event) -> None:
    """Rewrite the heartbeat every ``seconds`` until ``stop``; a failed write (full disk, NFS away) waits a beat."""
    while not stop.wait(seconds):
        try:
            _write(fd, holder)
        except OSError:
            pass


def release(run: Path | None = None) -> None:
    """Give up ``run``'s lock (None: all held here), leaving the file empty."""
    for folder in [Path(run)] if run is not None else list(_held):
        fd = _held.pop(folder, None)
        if fd is None:
            continue
        stop, beat = _beating.pop(folder)
        stop.set()
        beat.join()  # (no heartbeat after the file is emptied)
        try:
            os.ftruncate(fd, 0)
        except OSError:  # (full disk or folder gone: closing still releases the lock)
            pass
        os.close(fd)


def _locked(fd: int) -> bool:
    """Whether some process holds a lock on the file (F_GETLK takes none)."""
    query = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)  # struct flock: the whole file
    answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
    return struct.unpack("h", answer[:2])[0] != fcntl.F_UNLCK


def holder(run: Path, stale: float = STALE_SECONDS) -> dict | None:
    """The record of who trains in ``run`` now ({} if not yet written), or None when nobody does (``live``)."""
    path = Path(run) / LOCK
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        named, locked = _read(fd), _locked(fd)
    except OSError as e:
        if e.errno not in UNSUPPORTED:
            raise
        named, locked = _read(fd), None  # (the file system cannot tell)
    finally:
        os.close(fd)  # (no lock held: closing drops nothing)
    return named if live(named, locked, stale) else None
