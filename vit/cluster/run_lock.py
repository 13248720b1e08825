"""Who trains in a run folder: one launch at a time. The process that trains (global rank 0) holds a lock on
``<run>/.lock`` for the whole of its fit, the file naming it (pid, host, SLURM job, since when); a second
process for the same folder ends at once with one line naming the holder (RunError: exit 2), before it reads
or writes anything there: it removes no draft, starts no W&B run.

The lock is a POSIX record lock (``fcntl.lockf``): the operating system releases it when the process ends,
however it ends (a kill, a node's reboot), so a lock left by a process that died is free and the next run
takes it over (and says whose it was). It works across the nodes of a cluster on NFS (its lock manager) and on
Lustre mounted with ``flock``; on a file system that refuses locks, the run trains unguarded and says so in one
line; one mounted with ``localflock`` locks for the processes of one node only. Not inherited by the processes a
run forks (data loader workers), it never outlives the run's own process.

While it holds the lock, the holder rewrites a heartbeat in the file (its time, with the host) every
``HEARTBEAT_SECONDS`` from a thread of its own. A file system whose locks are local to a node (Lustre mounted
with ``localflock``, NFS with ``nolock``) shows another node no lock: there a fresh heartbeat (younger than
``STALE_SECONDS``) written on another host says that the run still trains (``holder``), and a stale one that it
ended without releasing the lock. Taking the lock reads no heartbeat: a requeued job whose last attempt died with
its node takes the folder over at once.

The other processes of a multi-process launch do not take it: Lightning's own launcher starts them after rank 0
holds it (``vit.cluster.runs.ENV``); the processes that SLURM or torchrun started wait until the lock names their own
launch, or end with the holder's line when another launch holds it (``wait_for_rank_zero``), so that no process
trains, or waits in a collective, alone. Rank 0 adds to the lock's record what they are to take from it
(``announce``: the checkpoint it resumes from): a record that names a live lock of this launch is this attempt's own.

A POSIX lock is dropped when its process closes any descriptor of the file: nothing but this module opens it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import struct
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from vit.cluster import launch
from vit.exits import LostProcesses, RunError

LOCK = ".lock"
UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)  # a file system that does not lock
HEARTBEAT_SECONDS = 60.0  # how often the holder rewrites its heartbeat
STALE_SECONDS = 300.0  # a heartbeat older than this (five missed beats) is a holder's that ended
_held: dict[Path, int] = {}  # run folder → the descriptor holding its lock in this process
_beating: dict[Path, tuple[threading.Event, threading.Thread]] = {}  # run folder → its heartbeat's thread
_records: dict[Path, dict] = {}  # run folder → the record this process keeps in its lock file
_writing = threading.Lock()  # (the heartbeat and announce write the same file)


def identity() -> str:
    """This attempt of this launch, as each of its processes names it alike: its SLURM job or torchrun id (else
    this process) and the launcher's restart count (a requeued job is a new attempt of the same name)."""
    return f"{launch.launch_name() or f'pid-{os.getpid()}'}/{launch.attempt()}"


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


def _refused(run: Path, holder: dict) -> RunError:
    who = f" ({describe(holder)})" if holder else ""
    return RunError(f"{run} is in use: another process trains in it{who}, and one process at a time trains in a run "
                    f"folder. Wait for it to end, or train in another folder (--run NAME)")


def take(run: Path, heartbeat: float = HEARTBEAT_SECONDS) -> str | None:
    """Hold ``run``'s lock until ``release`` or this process ends, rewriting the heartbeat every ``heartbeat``
    seconds; RunError naming the holder when another process holds it. Returns a line to print, or None: whose lock
    this took over (a process that ended without releasing it), or that the file system cannot lock."""
    run = Path(run)
    if run in _held:
        return None
    fd = os.open(run / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = _read(fd)
        os.close(fd)  # (this process holds no lock on the file: closing drops nothing)
        if e.errno in (errno.EACCES, errno.EAGAIN):
            raise _refused(run, holder) from None
        if e.errno in UNSUPPORTED:
            return (f"the file system of {run} does not lock files ({errno.errorcode[e.errno]}): nothing stops "
                    f"another process from training in this folder at the same time")
        raise
    previous = _read(fd)
    mine = {"launch": identity(), "pid": os.getpid(), "host": socket.gethostname(), "slurm_job": launch.slurm_job(),
            "since": _now()}
    _write(fd, mine)
    _held[run], _records[run] = fd, mine
    stop = threading.Event()
    beat = threading.Thread(target=_beat, args=(fd, mine, heartbeat, stop), name=f"heartbeat {run}", daemon=True)
    beat.start()
    _beating[run] = (stop, beat)
    if previous:  # released whole, the file is empty: this one's holder ended without releasing it
        return (f"took over {run}: its lock file names {describe(previous)}, which holds it no longer (it ended "
                f"without releasing it, or the folder was copied)")
    return None


def _write(fd: int, holder: dict) -> None:
    """``holder`` with a heartbeat of now as the file's whole content, on disk (fsync: a reader on another node of
    a network file system sees it), through the descriptor that holds the lock (closing another would drop it)."""
    data = (json.dumps({**holder, "heartbeat": _now()}) + "\n").encode()
    with _writing:
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
        _records.pop(folder, None)
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
    when no process does: a process holding its lock, or, where this machine sees no lock, one on another host
    whose heartbeat is younger than ``stale`` seconds (a file system whose locks another node does not see). On
    this host the lock alone tells: a holder here that ended has released it, whatever its heartbeat."""
    path = Path(run) / LOCK
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        named = _read(fd)
        try:
            if _locked(fd):
                return named
        except OSError as e:
            if e.errno not in UNSUPPORTED:
                raise
    finally:
        os.close(fd)  # (this process holds no lock on the file)
    age = heartbeat_age(named)
    if named.get("host") != socket.gethostname() and age is not None and age < stale:
        return named
    return None


def announce(run: Path, **facts) -> None:
    """Add ``facts`` to the record of ``run``'s lock that this process holds, for the other processes of its launch
    to read (``wait_for_rank_zero``): the checkpoint process 0 resumes from (vit.cluster.runs.choose_last). Nothing where
    this process holds no lock (a file system that does not lock: they choose by the same rule)."""
    fd = _held.get(Path(run))
    if fd is None:
        return
    record = _records[Path(run)]
    record.update(facts)  # (the heartbeat rewrites the record with them)
    _write(fd, record)


def wait_for_rank_zero(run: Path, seconds: float = 300.0, poll: float = 0.2, needs: str | None = None) -> dict | None:
    """On a process of a multi-process launch other than rank 0: go on once rank 0 holds ``run``'s lock (the file
    names this launch) and, with ``needs``, has announced that fact (``announce``): its record, read alike twice
    (not an earlier holder's, read as rank 0 takes the lock); returns it. RunError with the holder's line when another
    launch holds it (rank 0 ends with the same line); LostProcesses when rank 0 let the lock go before it announced
    (it failed, and says why). None on a file system that does not lock, and, said in one line, after ``seconds``
    without either: the process goes on, and the launch's own wait for its processes then ends it."""
    path = Path(run) / LOCK
    start = time.monotonic()
    deadline, foreign, said, ours, seen = start + seconds, None, False, False, None
    what = f"{run}'s lock" + (" and name the checkpoint it resumes from" if needs else "")
    while time.monotonic() < deadline:
        if not said and time.monotonic() - start > 10:
            said = True
            print(f"waiting for process 0 of this launch to take {what} (up to {seconds:.0f} s)", file=sys.stderr,
                  flush=True)
        if path.exists():
            fd = os.open(path, os.O_RDONLY)
            try:
                locked, holder = _locked(fd), _read(fd)
            except OSError as e:
                if e.errno in UNSUPPORTED:
                    return None
                raise
            finally:
                os.close(fd)  # (this process holds no lock on the file)
            if locked and holder.get("launch") == identity():
                # (twice alike: not the record of an earlier holder of this launch, read between rank 0's
                # taking the lock and writing its own)
                record = {k: v for k, v in holder.items() if k != "heartbeat"}
                if (needs is None or needs in holder) and record == seen:
                    return holder
                ours, seen = True, record
                time.sleep(poll)
                continue
            if ours and not locked:
                raise LostProcesses(f"process 0 of this launch let {run}'s lock go before it named the checkpoint "
                                    f"it resumes from (it failed, and says why)")
            if locked and holder:  # twice a second apart: not rank 0 between taking the lock and naming itself
                if foreign == holder:
                    raise _refused(Path(run), holder)
                foreign = holder
                time.sleep(1.0)
                continue
        foreign = None
        time.sleep(poll)
    print(f"process 0 of this launch did not take {what} within {seconds:.0f} s (a file system whose locks are "
          f"not seen across nodes, or process 0 failed and says why): going on", file=sys.stderr, flush=True)
    return None
