"""Who trains in a run folder: one launch at a time, the same rule on every node and file system.

Process 0 of a launch holds ``<run>/.lock`` for the whole of its fit: a POSIX lock (``fcntl.lockf``, released by
the operating system however the process ends) and, in the file, its record (launch, pid, host, SLURM job, since
when) with a heartbeat rewritten every ``HEARTBEAT_SECONDS`` by a thread of its own. The folder is held (``live``)
while its lock is, or, where this process cannot see the lock (a file system that does not lock; one whose locks
are local to a node, Lustre's ``localflock`` or NFS's ``nolock``, seen from another host), while the heartbeat is
younger than ``STALE_SECONDS``. A start for a held folder ends at once with one line naming the holder (RunError:
exit 2), before it reads or writes anything there; an earlier attempt of the same launch (a requeued SLURM job,
a restarted torchrun) is over and is taken over at once. vit-sync uploads no run whose folder is held.

Process 0 of a launch alone takes the lock; the others never read it: process 0 hands them its decision
(vit.cluster.runs.open_for_fit). What a file system that does not lock cannot tell: two starts within the
same second.

A POSIX lock is dropped when its process closes any descriptor of the file: nothing but this module opens it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import struct
import threading
from datetime import datetime, timezone
from pathlib import Path

from vit.cluster import launch
from vit.exits import RunError

LOCK = ".lock"
UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)  # a file system that does not lock
HEARTBEAT_SECONDS = 60.0  # how often the holder rewrites its heartbeat
STALE_SECONDS = 300.0  # a heartbeat older than this (five missed beats) is a holder's that ended
_held: dict[Path, int] = {}  # run folder → the descriptor holding its lock in this process
_beating: dict[Path, tuple[threading.Event, threading.Thread]] = {}  # run folder → its heartbeat's thread


def identity() -> str:
    """This attempt of this launch, as each of its processes names it alike: its SLURM job or torchrun id (else
    this process) and the launcher's restart count (a requeued job is a new attempt of the same name)."""
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
    beat = beat if beat.tzinfo is not None else beat.replace(tzinfo=timezone.utc)  # (written by another tool)
    return max(0.0, (datetime.now(timezone.utc) - beat).total_seconds())


def _read(fd: int) -> dict:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:  # written by another tool, or cut short: nothing to name
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
    """Whether ``holder`` (a lock file's record) still trains: its lock is held (``locked``), or, where this process
    cannot see the lock (``locked`` None: a file system that does not lock; a holder on another host, whose lock a
    node-local file system shows nowhere else), its heartbeat is younger than ``stale`` seconds. The one meaning of
    "a run folder is held", on every node and every file system."""
    if locked:
        return True
    age = heartbeat_age(holder)
    unseen = locked is None or holder.get("host") != socket.gethostname()
    return unseen and age is not None and age < stale


def take(run: Path, heartbeat: float = HEARTBEAT_SECONDS) -> str | None:
    """Hold ``run``'s lock until ``release`` or this process ends, rewriting the heartbeat every ``heartbeat``
    seconds; RunError naming the holder when another launch holds it (``live``: its lock, or where no lock can be
    seen, its heartbeat; an earlier attempt of this same launch, requeued, is over). Returns a line to print, or
    None: whose lock this took over (a process that ended without releasing it), or that the file system cannot
    lock (the record and its heartbeat are written all the same, and keep other starts and vit-sync away)."""
    run = Path(run)
    if run in _held:
        return None
    fd = os.open(run / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    said = None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EAGAIN, *UNSUPPORTED):
            os.close(fd)
            raise
        if e.errno in (errno.EACCES, errno.EAGAIN):
            holder = _read(fd)
            os.close(fd)  # (this process holds no lock on the file: closing drops nothing)
            raise _refused(run, holder) from None
        said = (f"the file system of {run} does not lock files ({errno.errorcode[e.errno]}): this run's record and "
                f"heartbeat in {LOCK} keep later starts and vit-sync away (two starts within the same second both "
                f"train)")
    previous = _read(fd)
    (name, ours), (theirs, attempt) = _launch({"launch": identity()}), _launch(previous)
    if (theirs != name or attempt == ours) and live(previous, None if said else False):
        os.close(fd)  # (closing drops this process's lock: nothing of it was written)
        raise _refused(run, previous, locked=False)
    mine = {"launch": identity(), "pid": os.getpid(), "host": socket.gethostname(), "slurm_job": launch.slurm_job(),
            "since": _now()}
    _write(fd, mine)
    _held[run] = fd
    stop = threading.Event()
    beat = threading.Thread(target=_beat, args=(fd, mine, heartbeat, stop), name=f"heartbeat {run}", daemon=True)
    beat.start()
    _beating[run] = (stop, beat)
    if said is None and previous:  # released whole, the file is empty: this one's holder ended without releasing it
        said = (f"took over {run}: its lock file names {describe(previous)}, which holds it no longer (it ended "
                f"without releasing it, or the folder was copied)")
    return said


def _write(fd: int, holder: dict) -> None:
    """``holder`` with a heartbeat of now as the file's whole content, on disk (fsync: a reader on another node of
    a network file system sees it), through the descriptor that holds the lock (closing another would drop it)."""
    data = (json.dumps({**holder, "heartbeat": _now()}) + "\n").encode()
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))
    os.fsync(fd)


def _beat(fd: int, holder: dict, seconds: float, stop: threading.Event) -> None:
    """The holder's heartbeat: rewritten every ``seconds`` until ``stop``. A write that fails (a full disk, a
    network file system away for a while) is tried again at the next beat; the lock holds all the same."""
    while not stop.wait(seconds):
        try:
            _write(fd, holder)
        except OSError:
            pass


def release(run: Path | None = None) -> None:
    """Give up ``run``'s lock (None: every one this process holds), leaving the file empty: no holder."""
    for folder in [Path(run)] if run is not None else list(_held):
        fd = _held.pop(folder, None)
        if fd is None:
            continue
        stop, beat = _beating.pop(folder)
        stop.set()
        beat.join()  # (no heartbeat is written after the file is emptied)
        try:
            os.ftruncate(fd, 0)
        except OSError:  # (a full disk or a folder gone: closing releases the lock all the same)
            pass
        os.close(fd)


def _locked(fd: int) -> bool:
    """Whether some process holds a lock on the file (F_GETLK: asks, takes nothing)."""
    query = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)  # struct flock: the whole file
    answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
    return struct.unpack("h", answer[:2])[0] != fcntl.F_UNLCK


def holder(run: Path, stale: float = STALE_SECONDS) -> dict | None:
    """Who trains in ``run`` now (its pid, host, SLURM job, heartbeat; {} when it has not named itself yet), or None
    when no process does (``live``)."""
    path = Path(run) / LOCK
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        named, locked = _read(fd), _locked(fd)
    except OSError as e:
        if e.errno not in UNSUPPORTED:
            raise
        named, locked = _read(fd), None  # (the file system does not say whether a process holds the lock)
    finally:
        os.close(fd)  # (this process holds no lock on the file)
    return named if live(named, locked, stale) else None
