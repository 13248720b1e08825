"""One process at a time trains in a run folder (vit.cluster.run_lock): a second one ends at once, naming the holder,
touching nothing (no draft removed); a lock left by a process that died is taken over; the same rule on a file
system that refuses locks and on one whose locks are local to a node."""

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest

from helpers import digest, train_here
from vit.cluster import run_lock, runs
from vit.exits import RunError

HOLD = ("import sys, time; from pathlib import Path; from vit.cluster import run_lock; run_lock.take(Path(sys.argv[1])); "
        "print('held', flush=True); time.sleep(300)")


def hold(run, **env) -> subprocess.Popen:
    """Another process that takes ``run``'s lock and keeps it (``env``: its launcher's variables)."""
    run.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **env})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_ends_at_once_naming_the_holder_and_a_dead_holders_lock_is_taken_over(tmp_path, fake_cifar,
                                                                                               capsys, caplog):
    run = tmp_path / "runs" / "smoke" / "a"
    draft = run / "checkpoints" / ".step.ckpt.4242.tmp"  # the holder's save under way
    draft.parent.mkdir(parents=True)
    draft.write_bytes(b"x" * 1000)
    holder = hold(run)
    try:
        before = digest(run)
        started = time.monotonic()
        assert train_here(tmp_path, fake_cifar, "--run", "a", "--ckpt_path", "last") == 2
        assert time.monotonic() - started < 60
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(err) == 1 and err[0].startswith(f"error: {run.relative_to(tmp_path)} is in use: another process "
                                                    f"trains in it (pid {holder.pid} on {socket.gethostname()}, "
                                                    "since "), err
        assert "--run NAME" in err[0] and "Traceback" not in err[0]
        assert digest(run) == before and draft.exists()  # nothing read into it, nothing removed
    finally:
        holder.send_signal(signal.SIGKILL)  # dies holding it: the operating system releases the lock
        holder.wait()
    caplog.set_level(logging.INFO)
    claimed = []
    try:
        folder, resume = runs.open_for_fit(run.parent, "last", "a", {}, {}, claimed)
        assert folder == run and resume is None and claimed == []
        assert f"took over {run}: its lock file names pid {holder.pid} on {socket.gethostname()}" in caplog.text
        assert "removed 1 draft(s)" in caplog.text and not draft.exists()  # the holder's drafts only
        other = subprocess.run([sys.executable, "-c", HOLD, str(run)], capture_output=True, text=True, timeout=60)
        assert other.returncode != 0 and f"(pid {os.getpid()} on " in other.stderr  # this test holds it
    finally:
        run_lock.release()
    assert (run / run_lock.LOCK).read_text() == ""  # released: nobody holds it, nobody to name


def test_vit_sync_leaves_a_run_that_still_trains_for_later(tmp_path, capsys):
    """An offline W&B log whose training still holds its run folder is not whole: vit-sync leaves it, says so, and
    uploads it once the training has ended."""
    from vit.commands.sync import main as sync

    run = tmp_path / "runs" / "smoke" / "version_0"
    offline = run / "wandb" / "offline-run-20260101_000000-abcd1234"
    offline.mkdir(parents=True)
    (offline / "run-abcd1234.wandb").write_bytes(b"")
    holder = hold(run)
    try:
        assert sync([str(tmp_path / "runs"), "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert "left for later: 1 offline W&B run still training" in out and "would upload" not in out
        assert "all uploaded" not in out
    finally:
        holder.kill()
        holder.wait()
    assert sync([str(tmp_path / "runs"), "--dry-run"]) == 0
    assert "would upload 1 offline W&B run of 1 under" in capsys.readouterr().out


def test_the_holder_beats_while_it_holds_the_lock_and_another_node_reads_the_heartbeat(tmp_path, monkeypatch, capsys):
    """The holder rewrites its heartbeat (here every 0.2 s) until it releases the lock. On a file system whose locks
    another node does not see (Lustre's localflock, NFS's nolock: here, a holder that died on another host, whose
    lock is gone), vit-sync there leaves a run with a fresh heartbeat for later, naming the host and the
    heartbeat's age; a heartbeat older than the stale limit is a run that ended."""
    from vit.commands.sync import main as sync

    run = tmp_path / "runs" / "smoke" / "slurm-7"
    offline = run / "wandb" / "offline-run-20260101_000000-abcd1234"
    offline.mkdir(parents=True)
    (offline / "run-abcd1234.wandb").write_bytes(b"")
    beating = ("import sys, time; from pathlib import Path; from vit.cluster import run_lock; "
               "run_lock.take(Path(sys.argv[1]), heartbeat=0.2); print('held', flush=True); sys.stdin.readline(); "
               "run_lock.release(); print('released', flush=True); time.sleep(300)")
    proc = subprocess.Popen([sys.executable, "-c", beating, str(run)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        first = json.loads((run / run_lock.LOCK).read_text())["heartbeat"]
        beats, deadline = [first], time.monotonic() + 30  # (the heartbeat is written to the second)
        while beats[-1] <= first and time.monotonic() < deadline:
            time.sleep(0.2)
            beats.append(json.loads((run / run_lock.LOCK).read_text())["heartbeat"])
        assert beats[-1] > first, beats
        proc.stdin.write("release\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "released"
        assert (run / run_lock.LOCK).read_text() == ""  # released: no heartbeat, nobody trains
    finally:
        proc.kill()
        proc.wait()
    holder = hold(run)
    holder.kill()  # dies holding it: the lock is gone, its heartbeat is fresh
    holder.wait()
    assert run_lock.holder(run) is None  # on its own host the lock alone tells
    host = socket.gethostname()
    monkeypatch.setattr(socket, "gethostname", lambda: "login1")  # another node, which sees no lock
    assert run_lock.holder(run)["pid"] == holder.pid
    assert sync([str(tmp_path / "runs"), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "left for later: 1 offline W&B run still training", out
    assert re.fullmatch(rf"  {re.escape(str(offline))}: trains as pid {holder.pid} on {re.escape(host)}, since \S+, "
                        r"heartbeat \d+ s ago; run vit-sync again once it has ended", out[1]), out
    assert run_lock.holder(run, stale=0.0) is None  # older than the limit: it ended without releasing the lock
    named = json.loads((run / run_lock.LOCK).read_text())
    old = datetime.now(timezone.utc) - timedelta(seconds=run_lock.STALE_SECONDS + 1)
    (run / run_lock.LOCK).write_text(json.dumps({**named, "heartbeat": old.isoformat(timespec="seconds")}))
    assert sync([str(tmp_path / "runs"), "--dry-run"]) == 0
    assert "would upload 1 offline W&B run of 1 under" in capsys.readouterr().out


def test_a_heartbeat_without_a_time_zone_is_read_as_utc():
    """A heartbeat written by another tool, without a time zone, is read as UTC."""
    naive = datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(seconds=30)
    assert 29 <= run_lock.heartbeat_age({"heartbeat": naive.isoformat()}) < 600


# a holder on a file system that refuses locks (ENOLCK, as some NFS mounts without a lock manager answer):
# argv[1] its run folder
HOLD_NO_LOCKS = ("import errno, fcntl, sys, time; from pathlib import Path; from vit.cluster import run_lock\n"
                 "def refuse(*args): raise OSError(errno.ENOLCK, 'No locks available')\n"
                 "fcntl.lockf = fcntl.fcntl = refuse\n"
                 "run = Path(sys.argv[1]); print(run_lock.take(run), file=sys.stderr, flush=True)\n"
                 "print('held', flush=True); time.sleep(300)")


def no_locks(monkeypatch):
    """This process on a file system that refuses locks."""
    import errno
    import fcntl

    def refuse(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "lockf", refuse)
    monkeypatch.setattr(fcntl, "fcntl", refuse)


def test_where_the_file_system_refuses_locks_a_run_that_trains_is_neither_uploaded_nor_taken(tmp_path, monkeypatch,
                                                                                            capsys):
    from vit.commands.sync import main as sync

    run = tmp_path / "runs" / "smoke" / "version_0"
    offline = run / "wandb" / "offline-run-20260101_000000-abcd1234"
    offline.mkdir(parents=True)
    (offline / "run-abcd1234.wandb").write_bytes(b"")
    proc = subprocess.Popen([sys.executable, "-c", HOLD_NO_LOCKS, str(run)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        no_locks(monkeypatch)
        assert run_lock.holder(run)["pid"] == proc.pid  # its record and heartbeat say it trains
        assert sync([str(tmp_path / "runs"), "--dry-run"]) == 0
        assert "left for later: 1 offline W&B run still training" in capsys.readouterr().out
        with pytest.raises(RunError, match=rf"is in use: another process trains in it \(pid {proc.pid} on "):
            run_lock.take(run)  # another start for the same folder
    finally:
        proc.kill()
        _, err = proc.communicate()
    assert "does not lock files (ENOLCK)" in err
    assert run_lock.holder(run, stale=0.0) is None  # a heartbeat past the limit: it ended


def test_where_locks_are_local_to_a_node_a_start_on_another_node_is_refused(tmp_path, monkeypatch):
    """A live holder on another node, whose lock this node does not see (Lustre's localflock: here, this process
    sees no lock and names itself as another host): another job's start for the folder is refused before it
    touches anything (its drafts stay). (The other processes of the holder's own launch never read the lock:
    vit.cluster.runs.open_for_fit.)"""
    job = {"SLURM_NTASKS": "2", "SLURM_JOB_ID": "41", "SLURM_JOB_NAME": "train"}
    for key in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    run = tmp_path / "slurm-41"
    run.mkdir()
    draft = run / runs.CHECKPOINTS / ".last.ckpt.123.tmp"
    draft.parent.mkdir()
    draft.write_bytes(b"a save in progress")
    proc = subprocess.Popen([sys.executable, "-c", HOLD_NO_LOCKS.replace("fcntl.lockf = fcntl.fcntl = refuse", ""),
                             str(run)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **job})
    try:
        assert proc.stdout.readline().strip() == "held"
        monkeypatch.setattr(run_lock, "_locked", lambda fd: False)  # this node sees no lock
        monkeypatch.setattr(fcntl_module(), "lockf", lambda *args: None)  # and takes one where one is held
        monkeypatch.setattr(socket, "gethostname", lambda: "node2")
        monkeypatch.setenv("SLURM_JOB_ID", "42")  # another job naming the same folder
        with pytest.raises(RunError, match=rf"is in use: another process trains in it \(pid {proc.pid} on "):
            run_lock.take(run)
        assert draft.exists()
    finally:
        proc.kill()
        proc.wait()


def fcntl_module():
    import fcntl

    return fcntl


def test_a_refusal_on_a_heartbeat_says_how_old_it_is_and_when_the_folder_is_free(tmp_path, monkeypatch):
    """Job 5 died on nodeA a minute ago; job 6 on nodeB, which sees no lock there, is refused on the heartbeat alone,
    and the line says so: its age, when the folder is free, and that removing .lock frees it at once."""
    run = tmp_path / "run"
    run.mkdir()
    beat = (datetime.now(timezone.utc) - timedelta(seconds=60)).isoformat(timespec="seconds")
    (run / run_lock.LOCK).write_text(json.dumps({"launch": "slurm-5/0", "pid": 7, "host": "nodeA", "slurm_job": "5",
                                                 "since": beat, "heartbeat": beat}))
    monkeypatch.setenv("SLURM_JOB_ID", "6")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    with pytest.raises(RunError, match=r"its lock is not seen from here, its heartbeat is 6\d s old: if that process "
                                       r"has ended, the folder is free in 2[34]\d s, or at once once you remove "):
        run_lock.take(run)
    assert json.loads((run / run_lock.LOCK).read_text())["pid"] == 7  # left as it was


@pytest.mark.parametrize("removed", ["before the lock file is opened", "after the removed lock file is locked"])
def test_a_start_takes_a_folder_that_a_failed_start_of_the_same_run_removes_as_it_takes_it(removed, tmp_path,
                                                                                           monkeypatch):
    """Two starts of one --run at once: the first fails and removes the folder it made (as vit-train does, its lock
    file last, before it releases the lock) while the second takes it. The second makes the folder anew and
    holds the lock of the file in it, not of the removed one; nothing is raised."""
    import fcntl
    import shutil

    run = tmp_path / "runs" / "a"
    real_open, real_lockf, calls = os.open, fcntl.lockf, []

    def remove_once(at: str) -> None:
        calls.append(at)
        if at == removed and calls.count(at) == 1:
            shutil.rmtree(run)  # (the first start's removal is done: its lock is released)

    monkeypatch.setattr(os, "open", lambda path, *args, **kwargs: path == run / run_lock.LOCK
                        and remove_once("before the lock file is opened") or real_open(path, *args, **kwargs))
    monkeypatch.setattr(fcntl, "lockf", lambda fd, how: real_lockf(fd, how)
                        or remove_once("after the removed lock file is locked"))
    try:
        assert run_lock.take(run) is None
        assert os.path.samestat(os.fstat(run_lock._held[run]), os.stat(run / run_lock.LOCK))
        assert json.loads((run / run_lock.LOCK).read_text())["pid"] == os.getpid()
        assert calls.count(removed) == 2  # (taken anew once)
    finally:
        run_lock.release()


@pytest.mark.parametrize("target", ["gone/lock", "elsewhere"])
def test_a_lock_file_that_is_a_link_is_refused_in_one_line(target, tmp_path):
    """A link, to nowhere or to a file elsewhere, is not followed: nothing is made or locked at its target. A run
    folder under a loop of links is refused in one line too."""
    run = tmp_path / "run"
    run.mkdir()
    (run / run_lock.LOCK).symlink_to(tmp_path / target)
    with pytest.raises(RunError, match=r"/run/\.lock is a link, not a lock file: remove it$"):
        run_lock.take(run)
    assert run not in run_lock._held and not (tmp_path / target).exists()
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(RunError, match=r"/loop is not a folder \(a link to one that is gone\?\): a run cannot be "
                                       r"made in it$"):
        run_lock.take(tmp_path / "loop" / "run")


@pytest.mark.parametrize("failure", ["the record cannot be written", "the heartbeat cannot start"])
def test_a_lock_whose_record_or_heartbeat_fails_is_given_up(failure, tmp_path, monkeypatch):
    """A full disk as the record is written, or no thread left for the heartbeat: the error is raised (the command
    says it), the lock is not kept, and a release after it has nothing to give up."""
    import errno
    import threading

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    def no_thread(*args):
        raise RuntimeError("can't start new thread")

    if failure == "the record cannot be written":
        monkeypatch.setattr(run_lock, "_write", full)
    else:
        monkeypatch.setattr(threading.Thread, "start", no_thread)
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises((OSError, RuntimeError), match="No space left|can't start new thread"):
        run_lock.take(tmp_path / "run")
    assert sorted(os.listdir("/proc/self/fd")) == before and tmp_path / "run" not in run_lock._held
    run_lock.release()


class OtherStart:
    """Another start that takes a run folder, and writes its W&B id there, when a test says so."""

    def __init__(self):
        self.proc = None

    def take(self, folder) -> None:
        self.proc = hold(folder)
        (folder / runs.WANDB_ID).write_text("holders\n")

    def assert_kept(self, folder) -> None:
        """``folder`` holds this start's lock and W&B id, and nothing else."""
        assert sorted(p.name for p in folder.iterdir()) == [run_lock.LOCK, runs.WANDB_ID]
        assert json.loads((folder / run_lock.LOCK).read_text())["pid"] == self.proc.pid


@pytest.fixture
def other_start():
    other = OtherStart()
    yield other
    if other.proc is not None:
        other.proc.kill()
        other.proc.wait()


def test_a_start_refused_by_a_holder_that_made_the_folder_meanwhile_leaves_the_holders_files(tmp_path, fake_cifar,
                                                                                           capsys, monkeypatch,
                                                                                           other_start):
    """Two starts of one new --run at once: the first makes the folder, and the second takes its lock (and writes
    its W&B id) before the first does. The first is refused, and removes nothing of the holder's."""
    run, make = tmp_path / "runs" / "smoke" / "a", run_lock.make

    def then_another_start_takes_it(folder, claimed):
        make(folder, claimed)
        if folder.absolute() == run:
            other_start.take(run)

    monkeypatch.setattr(run_lock, "make", then_another_start_takes_it)
    assert train_here(tmp_path, fake_cifar, "--run", "a") == 2
    assert "is in use" in capsys.readouterr().err
    other_start.assert_kept(run)


def test_a_failed_start_leaves_a_folder_it_made_that_another_start_holds_now(tmp_path, capsys, monkeypatch,
                                                                             other_start):
    """--run x/a makes x; another start of --run x takes x (and writes its W&B id) before this one fails: this one
    removes its own x/a, and x, which another start holds, stays as it is."""
    outer, take = tmp_path / "runs" / "smoke" / "x", run_lock.take

    def then_another_start_takes_the_outer_folder(*args, **kwargs):
        said = take(*args, **kwargs)
        other_start.take(outer)
        return said

    monkeypatch.setattr(run_lock, "take", then_another_start_takes_the_outer_folder)
    assert train_here(tmp_path, None, "--run", "x/a", "--data.root", str(tmp_path / "empty"),
                      "--data.download", "false") == 2
    assert "cifar-10-batches-py" in capsys.readouterr().err
    other_start.assert_kept(outer)


@pytest.mark.parametrize("kind", ["SIGUSR1", "SIGINT"])
def test_a_stop_signal_while_the_lock_is_taken_acts_once_it_is_held(kind, tmp_path, monkeypatch):
    """SIGUSR1 (vit-train's stop before training) or Ctrl-C as the heartbeat starts: it acts once ``take`` has
    returned, with the lock held and its heartbeat registered, so that the command's release gives up both. From
    another thread than the main one (which alone handles signals), ``take`` defers none."""
    import signal
    import threading

    class Stop(Exception):
        pass

    def stop(signum, frame):
        raise Stop

    start, kind = threading.Thread.start, getattr(signal, kind)

    def start_then_signal(thread):
        start(thread)
        os.kill(os.getpid(), kind)

    before = sorted(os.listdir("/proc/self/fd"))
    previous = signal.signal(kind, stop)
    monkeypatch.setattr(threading.Thread, "start", start_then_signal)
    try:
        with pytest.raises(Stop):
            run_lock.take(tmp_path / "run")
        assert run_lock.holds(tmp_path / "run") and signal.getsignal(kind) is stop
    finally:
        signal.signal(kind, previous)
        monkeypatch.undo()
        run_lock.release()
    assert sorted(os.listdir("/proc/self/fd")) == before and not run_lock.holds(tmp_path / "run")
    assert not any(t.name.startswith("heartbeat") for t in threading.enumerate())
    elsewhere = threading.Thread(target=run_lock.take, args=(tmp_path / "other",))
    elsewhere.start()
    elsewhere.join()
    assert run_lock.holds(tmp_path / "other")
    run_lock.release()


def test_a_folder_taken_anew_after_a_failed_start_removed_it_is_removed_when_this_start_fails_too(tmp_path, capsys,
                                                                                                  monkeypatch):
    """The folder of --run a existed (a failing start's) as this start looked, and was removed before it took the
    lock: this start makes it anew, so when it fails too, before training, it removes it as its own."""
    import shutil

    run = tmp_path / "runs" / "smoke" / "a"
    (run / run_lock.LOCK).parent.mkdir(parents=True)
    (run / run_lock.LOCK).touch()
    resolve = runs.resolve

    def then_the_failed_start_removes_it(*args):
        found = resolve(*args)
        shutil.rmtree(run)
        return found

    monkeypatch.setattr(runs, "resolve", then_the_failed_start_removes_it)
    assert train_here(tmp_path, None, "--run", "a", "--data.root", str(tmp_path / "empty"), "--data.download",
                      "false") == 2
    assert "cifar-10-batches-py" in capsys.readouterr().err
    assert not run.exists()


def test_a_lock_file_gone_stale_on_nfs_as_it_is_locked_is_taken_anew(tmp_path, monkeypatch):
    """NFS answers ESTALE where another node removed the lock file this start had opened: taken anew, no error."""
    import errno
    import fcntl

    lockf, calls = fcntl.lockf, []

    def stale_once(fd, how):
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(errno.ESTALE, "Stale file handle")
        return lockf(fd, how)

    monkeypatch.setattr(fcntl, "lockf", stale_once)
    before = sorted(os.listdir("/proc/self/fd"))
    try:
        assert run_lock.take(tmp_path / "run") is None and len(calls) == 2
        assert run_lock.holds(tmp_path / "run")
    finally:
        run_lock.release()
    assert sorted(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize("named", [True, False])
def test_a_run_folder_under_a_link_to_a_folder_that_is_gone_is_refused_in_one_line(named, tmp_path, capsys):
    """The runs' folder is a link to a scratch folder that was purged: one line naming it, exit 2, at once."""
    (tmp_path / "runs").symlink_to(tmp_path / "purged")
    started = time.monotonic()
    assert train_here(tmp_path, None, *(["--run", "a"] if named else []), "--data.root", str(tmp_path / "empty"),
                      "--data.download", "false") == 2
    (error,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert error == "error: runs is not a folder (a link to one that is gone?): a run cannot be made in it"
    assert time.monotonic() - started < 60 and not (tmp_path / "purged").exists()


def test_folders_that_exist_are_not_made_again(tmp_path, monkeypatch):
    """autofs and NFS may answer EACCES, not EEXIST, to making a folder that exists: such a folder is used as it is;
    only the folders made here are claimed."""
    from pathlib import Path

    mkdir = Path.mkdir

    def refuse_existing(path, *args, **kwargs):
        if path.exists():
            raise PermissionError(13, "Permission denied", str(path))
        return mkdir(path, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refuse_existing)
    (tmp_path / "scratch").mkdir()
    claimed = []
    try:
        assert run_lock.take(tmp_path / "scratch" / "runs" / "a", claimed=claimed) is None
        assert claimed == [tmp_path / "scratch" / "runs", tmp_path / "scratch" / "runs" / "a"]
    finally:
        run_lock.release()
