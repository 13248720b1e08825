"""Run folders after a copy (vit.cluster.runs, vit.cluster.checkpoint_io): `--ckpt_path last` takes the newest checkpoint and the
newest run by the time each checkpoint records, not by files' modification times, which `cp -r` resets (a run
restarted from an earlier checkpoint follows its new branch); the best checkpoint is the one the run's checkpoint
callback recorded; drafts of killed saves are removed when a run starts again; a file system that refuses to
sync a folder does not fail a save that is in place."""

import errno
import os
import shutil
import stat
import subprocess
import sys
import time

import pytest
import torch

from helpers import EVERY_STEP, SLURM_TASK, assert_same_training_state, load, train_here
from vit.cluster import runs
from vit.cluster.checkpoint_io import AtomicCheckpointIO, save_atomically

QUIET = ["--trainer.logger", "false", "--test_after_fit", "false"]
# another process that takes the lock of the run folder argv[1] and keeps it
HOLD = ("import sys, time; from pathlib import Path; from vit.cluster import run_lock; run = Path(sys.argv[1]); "
        "run_lock.take(run); print('held', flush=True); time.sleep(300)")
SMALLER = ["--model.arch.dim", "32", "--model.arch.depth", "1", "--model.arch.heads", "2"]  # the smoke recipe, smaller


def write(path, step: int, saved: float | None = None, mtime: float = 0.0, size: int = 10,
          best: str | None = None) -> None:
    """A checkpoint of ``step`` steps saved at ``saved`` (as vit's writer stamps it; None: an older writer's),
    its file's modification time set to ``mtime`` (a copy's); ``best``: the best checkpoint its monitoring
    ModelCheckpoint had recorded (as Lightning keeps it in the callbacks' state)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ckpt = {"state_dict": {"w": torch.full((size,), float(step))}, "global_step": step,
            "CIFAR10DataModule": {"epoch": 0, "images": 0, "skipped_images": 0, "epoch_end": True},
            "callbacks": {"TrainingClock": {"steps": step}}}  # (what vit-train resumes: its clock and position)
    if best is not None:
        ckpt["callbacks"] |= {"ModelCheckpoint{'monitor': 'val/acc'}": {"monitor": "val/acc", "best_model_path": best},
                             "ModelCheckpoint{'monitor': None}": {"monitor": None, "best_model_path": ""}}
    torch.save(ckpt if saved is None else {**ckpt, "saved_at": saved}, path)
    os.utime(path, (mtime, mtime))


def test_each_checkpoint_records_when_it_was_saved(tmp_path):
    before = time.time()
    AtomicCheckpointIO().save_checkpoint({"state_dict": {}, "global_step": 3}, tmp_path / "last.ckpt")
    assert runs.saved_step(tmp_path / "last.ckpt")[0] == 3
    assert before <= runs.saved_step(tmp_path / "last.ckpt")[1] <= time.time()


def test_the_newest_checkpoint_by_its_recorded_time_comes_first_whatever_the_files_times(tmp_path):
    """Modification times reversed (as after a copy in reverse order): the order is by the times the files
    record; a file whose step cannot be read comes first, so that the full read names it."""
    folder = tmp_path / "run" / runs.CHECKPOINTS
    write(folder / "best-epoch001-acc0.5000.ckpt", 16, saved=190.0, mtime=9000)
    write(folder / "best-epoch000-acc0.4000.ckpt", 8, saved=100.0, mtime=8000)
    write(folder / "last.ckpt", 16, saved=200.0, mtime=7000)  # saved after the best one of its epoch
    write(folder / "step.ckpt", 12, saved=150.0, mtime=6000)
    assert [p.name for p in runs.checkpoints(tmp_path / "run")] == \
        ["last.ckpt", "best-epoch001-acc0.5000.ckpt", "step.ckpt", "best-epoch000-acc0.4000.ckpt"]
    write(folder / "step.ckpt", 20, saved=400.0, mtime=1)
    (folder / "torn.ckpt").write_bytes((folder / "last.ckpt").read_bytes()[:300])
    os.utime(folder / "torn.ckpt", (0, 0))
    assert [p.name for p in runs.checkpoints(tmp_path / "run")][:3] == ["torn.ckpt", "step.ckpt", "last.ckpt"]
    path, ckpt, skipped = runs.newest_readable(tmp_path / "run")
    assert path.name == "step.ckpt" and ckpt["global_step"] == 20
    assert skipped.startswith(f"; skipped {folder / 'torn.ckpt'}: not a readable checkpoint")


def test_a_branch_restarted_from_an_earlier_checkpoint_comes_before_the_abandoned_one(tmp_path):
    """The run was restarted from step 6 and saved step.ckpt at step 9 after the old branch's last.ckpt of step
    12: step.ckpt is the newer; a file that records no time comes after every one that does, whatever its
    modification time (a copy renews it)."""
    folder = tmp_path / "run" / runs.CHECKPOINTS
    write(folder / "last.ckpt", 12, saved=100.0, mtime=9000)
    write(folder / "mine.ckpt", 6, saved=50.0, mtime=9500)  # the user's copy, to restart from
    write(folder / "step.ckpt", 9, saved=200.0, mtime=10)
    assert [p.name for p in runs.checkpoints(tmp_path / "run")] == ["step.ckpt", "last.ckpt", "mine.ckpt"]
    write(folder / "old.ckpt", 20, saved=None, mtime=2e9)
    write(folder / "older.ckpt", 30, saved=None, mtime=1e9)
    assert [p.name for p in runs.checkpoints(tmp_path / "run")] == \
        ["step.ckpt", "last.ckpt", "mine.ckpt", "old.ckpt", "older.ckpt"]


def test_the_best_checkpoint_is_the_one_the_run_recorded_not_the_newest_file(tmp_path):
    """save_top_k 2 and a copy that gave the worse best file the newest time: the best is the file that the
    newest checkpoint's monitoring callback names, looked up in this run's folder (the record names the folder
    of the run that was copied); without a monitoring callback, the newest checkpoint; a recorded file that is
    gone is said in one line."""
    from vit.exits import RunError

    folder = tmp_path / "run" / runs.CHECKPOINTS
    elsewhere = "/old/place/runs/x/version_0/checkpoints/best-epoch001-acc0.6000.ckpt"
    write(folder / "best-epoch001-acc0.6000.ckpt", 8, saved=100.0, mtime=10)
    write(folder / "best-epoch002-acc0.5000.ckpt", 12, saved=150.0, mtime=9000)
    write(folder / "last.ckpt", 12, saved=160.0, mtime=20, best=elsewhere)
    assert runs.best_checkpoint(tmp_path / "run") == folder / "best-epoch001-acc0.6000.ckpt"
    write(folder / "last.ckpt", 12, saved=160.0, mtime=20)  # no callback monitors a metric
    assert runs.best_checkpoint(tmp_path / "run") == folder / "last.ckpt"
    write(folder / "last.ckpt", 12, saved=160.0, mtime=20, best=elsewhere)
    (folder / "best-epoch001-acc0.6000.ckpt").unlink()
    with pytest.raises(RunError, match="its best checkpoint, best-epoch001-acc0.6000.ckpt \\(by last.ckpt's record\\), "
                                       "is not in"):
        runs.best_checkpoint(tmp_path / "run")
    assert runs.best_checkpoint(tmp_path / "none") is None


def test_at_equal_steps_the_later_saved_of_step_and_last_comes_first(tmp_path):
    folder = tmp_path / "run" / runs.CHECKPOINTS
    write(folder / "last.ckpt", 8, saved=100.0, mtime=5)
    write(folder / "step.ckpt", 8, saved=101.0, mtime=1)
    assert runs.last_checkpoint(tmp_path / "run").name == "step.ckpt"
    write(folder / "step.ckpt", 8, saved=None, mtime=1)  # an older writer's: by the files' times
    write(folder / "last.ckpt", 8, saved=None, mtime=2)
    assert runs.last_checkpoint(tmp_path / "run").name == "last.ckpt"
    os.utime(folder / "step.ckpt", (3, 3))
    assert runs.last_checkpoint(tmp_path / "run").name == "step.ckpt"


def test_the_newest_run_is_the_one_whose_checkpoint_was_saved_last_after_a_copy(tmp_path):
    """Run a saved its last checkpoint before run b; a copy gave a's files the newer modification times. The
    newest run is b; a run whose checkpoints record no time (an older writer) comes after every run whose
    checkpoints do, whatever their files' times."""
    write(tmp_path / "a" / runs.CHECKPOINTS / "last.ckpt", 100, saved=1000.0, mtime=5000)
    write(tmp_path / "b" / runs.CHECKPOINTS / "step.ckpt", 3, saved=2000.0, mtime=4000)
    write(tmp_path / "b" / runs.CHECKPOINTS / "best-epoch000-acc0.1000.ckpt", 2, saved=1500.0, mtime=4500)
    (tmp_path / "empty" / runs.CHECKPOINTS).mkdir(parents=True)
    assert runs.newest_run(tmp_path) == tmp_path / "b"
    write(tmp_path / "c" / runs.CHECKPOINTS / "last.ckpt", 1, saved=None, mtime=9000)
    assert runs.newest_run(tmp_path) == tmp_path / "b"
    write(tmp_path / "c" / runs.CHECKPOINTS / "step.ckpt", 1, saved=2100.0, mtime=1)
    assert runs.newest_run(tmp_path) == tmp_path / "c"
    assert runs.newest_run(tmp_path / "none") is None


def test_the_step_is_read_without_reading_the_tensors(tmp_path):
    """torch.load with mmap: learning a 40 MB checkpoint's step reads a few kB of it (Linux's count of the
    bytes a process read)."""
    if not os.path.exists("/proc/self/io"):
        pytest.skip("needs Linux's /proc/self/io")
    path = tmp_path / "run" / runs.CHECKPOINTS / "last.ckpt"
    write(path, 7, saved=5.0, size=10_000_000)

    def bytes_read() -> int:
        return int(next(line for line in open("/proc/self/io") if line.startswith("rchar:")).split()[1])

    before = bytes_read()
    assert runs.saved_step(path) == (7, 5.0)
    assert bytes_read() - before < path.stat().st_size / 100


def test_a_file_system_that_cannot_map_files_reads_them_whole(tmp_path, monkeypatch):
    real_load = torch.load

    def no_mmap(*args, mmap=None, **kwargs):
        if mmap:
            raise OSError(errno.ENODEV, "mmap: No such device")
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", no_mmap)
    folder = tmp_path / "run" / runs.CHECKPOINTS
    write(folder / "step.ckpt", 12, saved=2.0)
    write(folder / "best-epoch000-acc0.4000.ckpt", 8, saved=1.0)
    assert runs.saved_step(folder / "step.ckpt") == (12, 2.0) and runs.last_checkpoint(tmp_path / "run").name == "step.ckpt"


@pytest.mark.parametrize("refusal", [errno.EINVAL, errno.ENOTSUP])
def test_a_folder_sync_the_file_system_refuses_is_no_error(tmp_path, monkeypatch, refusal):
    real_fsync = os.fsync

    def refuses_folders(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(refusal, os.strerror(refusal))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", refuses_folders)
    path = tmp_path / "checkpoints" / "last.ckpt"
    save_atomically({"step": 1}, path)
    assert load(path) == {"step": 1} and os.listdir(path.parent) == ["last.ckpt"]

    def fails(fd):  # a real failure of the disk is still one
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fails)
    with pytest.raises(OSError, match="Input/output error") as e:
        save_atomically({"step": 2}, path)
    assert e.value.errno == errno.EIO and e.value.filename == str(path.parent)


def test_a_copied_run_resumes_from_its_newest_step_and_its_drafts_are_removed(tmp_path, fake_cifar_session, caplog):
    """A run crashed in epoch 1 (step.ckpt of step 10, last.ckpt and best of step 8) is copied as `cp -r` does
    (new modification times, here set so that the best checkpoint looks newest and step.ckpt oldest), with the
    drafts two killed saves left and a checkpoint of many more steps that records no time, the newest file of
    all. `--ckpt_path last` resumes the copy from step.ckpt, removes the drafts and nothing else, and ends with the
    uninterrupted run's weights."""
    args = ["--trainer.max_epochs", "2", *QUIET, *SMALLER, *EVERY_STEP]
    full, part, home = tmp_path / "full", tmp_path / "part", tmp_path / "home"
    for folder in (full, part, home):
        folder.mkdir()
    assert train_here(full, fake_cifar_session, *args) == 0
    with pytest.raises(RuntimeError, match="crashed at step 11"):
        train_here(part, fake_cifar_session, *args, "--trainer.callbacks+=callbacks.CrashAtStep",
                   "--trainer.callbacks.step", "11", "--trainer.callbacks.kill", "false")
    shutil.copytree(part / "runs", home / "runs", copy_function=shutil.copyfile)  # no times kept
    checkpoints = home / "runs/smoke/version_0/checkpoints"
    (best,) = checkpoints.glob("best-*.ckpt")
    for age, name in enumerate([best.name, "last.ckpt", "step.ckpt"]):
        os.utime(checkpoints / name, (2e9 - age * 1e3, 2e9 - age * 1e3))
    assert load(checkpoints / "step.ckpt")["global_step"] == 10 and load(best)["global_step"] == 8
    assert load(best)["saved_at"] < load(checkpoints / "step.ckpt")["saved_at"]  # as training stamped them
    drafts = [f".step.ckpt.{pid}.tmp" for pid in (4242, 4343)]
    for draft in drafts:
        shutil.copyfile(checkpoints / "last.ckpt", checkpoints / draft)
    (checkpoints / "notes.txt").write_text("mine")
    older = {k: v for k, v in load(best).items() if k != "saved_at"}  # written before checkpoints recorded a time
    torch.save({**older, "epoch": 41, "global_step": 400}, checkpoints / "best-epoch041-acc0.9000.ckpt")
    os.utime(checkpoints / "best-epoch041-acc0.9000.ckpt", (2e9 + 1e3, 2e9 + 1e3))  # the copy's newest time
    caplog.clear()
    assert train_here(home, fake_cifar_session, *args, "--ckpt_path", "last") == 0
    lines = [r.getMessage() for r in caplog.records]
    assert "resuming runs/smoke/version_0 (the newest run under runs/smoke) from its step.ckpt" in lines
    (removed,) = [line for line in lines if line.startswith("removed 2 draft(s)")]
    assert all(draft in removed for draft in drafts)
    assert not list(checkpoints.glob(".*")) and (checkpoints / "notes.txt").read_text() == "mine"
    assert_same_training_state(load(full / "runs/smoke/version_0/checkpoints/last.ckpt"),
                               load(checkpoints / "last.ckpt"))




def no_launcher(monkeypatch) -> None:
    for key in ("SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_PROCID", "SLURM_ARRAY_JOB_ID",
                "SLURM_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "WORLD_SIZE", "RANK", "LOCAL_RANK", runs.ENV,
                runs.RESUMES):
        monkeypatch.delenv(key, raising=False)


def test_after_cp_r_last_takes_the_newest_checkpoint_that_records_its_time(tmp_path, monkeypatch):
    """Run x saved step.ckpt last; its best-epoch041 and all of run y were written before checkpoints recorded
    the time they were saved. A copy that renews every file's time (as `cp -r` does), the old files copied last:
    `--ckpt_path last` resumes run x from step.ckpt, not from a file that records no time."""
    from vit.cluster import run_lock

    no_launcher(monkeypatch)
    x = tmp_path / "runs" / "x" / runs.CHECKPOINTS
    write(x / "best-epoch041-acc0.9000.ckpt", 41, saved=None, mtime=100)
    write(x / "last.ckpt", 50, saved=1000.0, mtime=1000)
    write(x / "step.ckpt", 55, saved=1100.0, mtime=1100)
    write(tmp_path / "runs" / "y" / runs.CHECKPOINTS / "last.ckpt", 90, saved=None, mtime=200)
    shutil.copytree(tmp_path / "runs", tmp_path / "copy", copy_function=shutil.copyfile)  # times renewed
    now = time.time()
    for old in ("x/checkpoints/best-epoch041-acc0.9000.ckpt", "y/checkpoints/last.ckpt"):
        os.utime(tmp_path / "copy" / old, (now + 60, now + 60))  # copied last
    assert os.stat(tmp_path / "copy/x/checkpoints/step.ckpt").st_mtime > 1e9  # (a copy's time, not the run's)
    try:
        run, (path, ckpt) = runs.open_for_fit(tmp_path / "copy", "last", None, {}, {}, [])
        assert run == tmp_path / "copy" / "x" and path.name == "step.ckpt" and ckpt["global_step"] == 55
        run, (path, ckpt) = runs.open_for_fit(tmp_path / "copy", "last", "y", {}, {}, [])  # y has only the old one
        assert path.name == "last.ckpt" and ckpt["global_step"] == 90
    finally:
        run_lock.release()


def test_process_zero_chooses_the_checkpoint_once_it_holds_the_folder(tmp_path, monkeypatch):
    """While another launch holds the folder, process 0 ends naming it before it reads a checkpoint there; once
    it holds it, it chooses."""
    from vit.cluster import run_lock
    from vit.exits import RunError

    no_launcher(monkeypatch)
    run = tmp_path / "runs" / "x"
    write(run / runs.CHECKPOINTS / "step.ckpt", 4, saved=1.0)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    read = []
    monkeypatch.setattr(runs, "saved_step", lambda path: read.append(path))
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunError, match="is in use"):
            runs.open_for_fit(tmp_path / "runs", "last", "x", {}, {}, [])
        assert read == []
    finally:
        holder.kill()
        holder.wait()
    monkeypatch.undo()
    no_launcher(monkeypatch)
    try:
        _, (path, _) = runs.open_for_fit(tmp_path / "runs", "last", "x", {}, {}, [])
        assert path.name == "step.ckpt"
    finally:
        run_lock.release()


# process RANK of a launch of 2 (a launcher's variables: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
# opens run argv[2] under argv[1] for --ckpt_path last and prints what it got; process 1 never looks at the folder or its
# lock; with DIES=1, process 0 dies before it decides; with FAILS=1, it fails with an error that is no bad input
START = """
import json, os, sys
from pathlib import Path
from vit.cluster import launch, run_lock, runs
if os.environ["RANK"] != "0":
    runs.newest_readable = run_lock.take = lambda *args: sys.exit("process 1 looked at the folder or its lock")
elif os.environ.get("DIES"):
    runs.decide = lambda *args: os._exit(3)
elif os.environ.get("FAILS"):
    def decide(*args):
        raise OSError("the disk went away")
    runs.decide = decide
launch.join_group("gloo", 60)
try:
    run, (path, ckpt) = runs.open_for_fit(Path(sys.argv[1]), "last", sys.argv[2], {}, {}, [])
    print(json.dumps([run.name, path.name, ckpt["global_step"], "state_dict" in ckpt]))
except Exception as e:
    print(json.dumps([type(e).__name__, str(e)]))
"""


def launch_of_two(root, name: str, **env) -> list:
    """What each process of a launch of 2 (``START``) got, in rank order."""
    import json
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))
            and k not in (runs.ENV, runs.RESUMES)}
    procs = [subprocess.Popen([sys.executable, "-c", START, str(root), name], stdout=subprocess.PIPE, text=True,
                              env={**base, **env, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}) for rank in range(2)]
    try:
        return [json.loads(proc.communicate(timeout=120)[0] or "null") for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_process_zero_decides_and_hands_its_decision_to_the_others_through_the_process_group(tmp_path):
    """Process 0 of a launch holds the folder and chooses the checkpoint (step.ckpt, saved last); process 1, which
    never reads the folder, its lock or the checkpoint's weights, resumes from the same one, with its contents but
    the weights. While another launch holds the folder, process 0's refusal is every process's, in the same line.
    A process 0 that fails while it decides ends the others with a line naming its error, and one that dies ends
    them at once (their broadcast fails: exit 5), never a wait."""
    from vit import failures

    run = tmp_path / "runs" / "x"
    write(run / runs.CHECKPOINTS / "last.ckpt", 6, saved=100.0)
    write(run / runs.CHECKPOINTS / "step.ckpt", 9, saved=200.0)
    assert launch_of_two(tmp_path / "runs", "x") == [["x", "step.ckpt", 9, True], ["x", "step.ckpt", 9, False]]
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        zero, one = launch_of_two(tmp_path / "runs", "x")
    finally:
        holder.kill()
        holder.wait()
    assert zero[0] == "RunError" and zero[1].startswith(f"{run} is in use: another process trains in it (pid "
                                                        f"{holder.pid} ") and one == zero
    assert launch_of_two(tmp_path / "runs", "x", FAILS="1") == [
        ["OSError", "the disk went away"],
        ["LostProcesses", "process 0 failed while it made its run folder and the checkpoint it resumes from (OSError: "
                          "the disk went away); it says why"]]
    started = time.monotonic()
    zero, one = launch_of_two(tmp_path / "runs", "x", DIES="1")
    assert zero is None and failures.lost_contact(RuntimeError(one[1])) and time.monotonic() - started < 100


def test_processes_of_lightnings_launcher_take_the_launching_processs_decision(tmp_path, monkeypatch):
    """A process that Lightning's DDP launcher started takes the launching process's folder and checkpoint, where
    its own look at the folder would choose another (step.ckpt, saved later)."""
    no_launcher(monkeypatch)
    run = tmp_path / "runs" / "x"
    write(run / runs.CHECKPOINTS / "mine.ckpt", 6, saved=100.0)
    write(run / runs.CHECKPOINTS / "step.ckpt", 9, saved=200.0)
    monkeypatch.setenv(runs.ENV, str(run))
    monkeypatch.setenv(runs.RESUMES, str(run / runs.CHECKPOINTS / "mine.ckpt"))
    _, (path, ckpt) = runs.open_for_fit(tmp_path / "runs", "last", None, {}, {}, [])
    assert path.name == "mine.ckpt" and ckpt["global_step"] == 6


def test_vit_runs_moves_the_runs_the_plans_folders_and_their_array_logs(tmp_path, monkeypatch, fake_cifar, capsys):
    """VIT_RUNS (a scratch folder) is where vit-train's runs, vit-plan's folders and its job array's SLURM logs
    go, and where vit-sync looks, when no option names a folder: nothing lands in the working folder."""
    from vit.commands.plan import main as plan
    from vit.commands.sync import main as sync

    scratch, clone = tmp_path / "scratch", tmp_path / "clone"
    clone.mkdir()
    monkeypatch.setenv("VIT_RUNS", str(scratch))
    assert train_here(clone, fake_cifar, "--trainer.max_steps", "1", "--test_after_fit", "false") == 0
    assert (scratch / "smoke/version_0/checkpoints/last.ckpt").is_file()
    (clone / "two.yaml").write_text("args: [--config, smoke]\nruns: [{name: a}, {name: b}]\n")
    monkeypatch.chdir(clone)
    assert plan(["submit", "two.yaml", "--dry-run"]) == 0
    script = (scratch / "two/two.sbatch").read_text()
    assert f"#SBATCH --output={scratch}/two/slurm-%A_%a.out\n" in script and f"--runs {scratch}\n" in script
    offline = scratch / "smoke/version_0/wandb/offline-run-20260101_000000-abcd1234"
    offline.mkdir(parents=True)
    (offline / "run-abcd1234.wandb").write_bytes(b"")
    capsys.readouterr()
    assert sync(["--dry-run"]) == 0
    assert capsys.readouterr().out.startswith(f"would upload 1 offline W&B run of 1 under {scratch}:")
    assert sorted(p.name for p in clone.iterdir()) == ["two.yaml"]


def test_a_run_restarted_from_an_earlier_checkpoint_and_preempted_resumes_on_its_new_branch(
        tmp_path, fake_cifar_session, monkeypatch, caplog):
    """A one-task SLURM job (its variables, in this process) trains 2 epochs (12 steps, last.ckpt), keeping a copy
    of epoch 0's last.ckpt in its checkpoints folder. The user restarts it from that copy for 3 epochs; preempted
    (SIGUSR1) at step 9, the requeued job (train.sbatch's arguments again, the file's included) takes that
    step's step.ckpt, not the file again nor the old branch's last.ckpt of step 12, and ends with the weights
    of the new branch run without a stop."""
    import signal

    tiny = ["--model.arch.dim", "16", "--model.arch.depth", "1", "--model.arch.heads", "2", "--data.batch_size", "64",
            *QUIET, "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
            "--trainer.log_every_n_steps", "1", *EVERY_STEP]
    longer = [*tiny, "--trainer.max_epochs", "3"]
    job, reference = tmp_path / "job", tmp_path / "reference"
    job.mkdir(), reference.mkdir()
    for key, value in SLURM_TASK.items():
        monkeypatch.setenv(key, value)
    checkpoints = job / "runs/smoke/slurm-77/checkpoints"
    handler = signal.getsignal(signal.SIGUSR1)
    try:
        assert train_here(job, fake_cifar_session, *tiny, "--trainer.max_epochs", "2",
                          "--trainer.callbacks+=callbacks.StopAfterEpoch", "--trainer.callbacks.epoch", "0") == 0
        shutil.copy(checkpoints / "last.ckpt", checkpoints / "epoch0.ckpt")
        assert train_here(job, fake_cifar_session, *tiny, "--trainer.max_epochs", "2", "--ckpt_path", "last") == 0
        assert load(checkpoints / "last.ckpt")["global_step"] == 12
        restart = ["--ckpt_path", "last", "--ckpt_path", str(checkpoints / "epoch0.ckpt"),  # as train.sbatch runs it
                   "--trainer.callbacks+=callbacks.SignalAtBatch", "--trainer.callbacks.batch", "9",
                   "--trainer.callbacks.signal", "SIGUSR1"]  # (the resumed run's batches come after the 9th)
        assert train_here(job, fake_cifar_session, *longer, *restart) == 4
        assert load(checkpoints / "step.ckpt")["global_step"] == 9
        assert load(checkpoints / "last.ckpt")["global_step"] == 12  # the abandoned branch's, with more steps
        caplog.clear()
        monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # requeued: the same arguments, FILE's included
        assert train_here(job, fake_cifar_session, *longer, *restart) == 0
        assert "resuming runs/smoke/slurm-77 from its step.ckpt" in caplog.text
        assert f"attempt 1 of this launch: it continues from its run folder's newest checkpoint, which it wrote; " \
               f"--ckpt_path " \
               f"{checkpoints / 'epoch0.ckpt'} is where its first attempt started" in caplog.text
        monkeypatch.delenv("SLURM_RESTART_COUNT")
        for key in SLURM_TASK:
            monkeypatch.delenv(key)
        shutil.copy(checkpoints / "epoch0.ckpt", reference / "epoch0.ckpt")
        assert train_here(reference, fake_cifar_session, *longer, "--ckpt_path", str(reference / "epoch0.ckpt")) == 0
    finally:
        signal.signal(signal.SIGUSR1, handler)
    assert_same_training_state(load(next(reference.glob("runs/smoke/version_*/checkpoints/last.ckpt"))),
                               load(checkpoints / "last.ckpt"))


@pytest.mark.parametrize("written_by,resumed", [("slurm-88", "last.ckpt"), ("slurm-5", "start.ckpt")])
def test_a_requeued_attempt_goes_on_from_its_own_checkpoint_only(tmp_path, monkeypatch, written_by, resumed):
    """Job 88 was started with --run foo --ckpt_path start.ckpt, in a folder that holds another job's checkpoint
    of an abandoned branch. Requeued (attempt 1, the same arguments), it goes on from the folder's newest
    checkpoint where job 88 wrote it, and from start.ckpt again where it wrote none (killed before its first)."""
    from vit.cluster import run_lock

    no_launcher(monkeypatch)
    for key, value in {"SLURM_NTASKS": "1", "SLURM_JOB_ID": "88", "SLURM_JOB_NAME": "train",
                       "SLURM_RESTART_COUNT": "1"}.items():
        monkeypatch.setenv(key, value)
    last = tmp_path / "runs" / "foo" / runs.CHECKPOINTS / "last.ckpt"
    write(last, 12, saved=200.0)
    torch.save({**load(last), "vit": {"launch": written_by}}, last)
    start = tmp_path / "start.ckpt"
    write(start, 4, saved=100.0)
    try:
        _, (path, _) = runs.open_for_fit(tmp_path / "runs", str(start), "foo", {}, {}, [])
    finally:
        run_lock.release()
    assert path.name == resumed


@pytest.mark.parametrize("launch,restarts,variables", [
    ("slurm-88", "SLURM_RESTART_COUNT", {"SLURM_NTASKS": "1", "SLURM_JOB_ID": "88", "SLURM_JOB_NAME": "train"}),
    ("torchrun-abc", "TORCHELASTIC_RESTART_COUNT",
     {"TORCHELASTIC_RUN_ID": "abc", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0", "WORLD_SIZE": "1"})])
def test_a_launchs_second_training_command_is_refused_and_a_restart_goes_on_from_its_own_commands_run(
        tmp_path, monkeypatch, launch, restarts, variables):
    """In one SLURM job or torchrun launch (no --run), a second training command (another command line) would
    write into the folder the first one trained (its checkpoints, its W&B id): refused in one line before any
    folder is taken, from nothing or from a file elsewhere, in the first attempt and in a restart alike. The
    first command restarted (attempt 1, the same command line) goes on from the newest checkpoint it wrote,
    with or without --ckpt_path, instead of training anew over it; a file of the folder itself starts a branch."""
    from vit.cluster import run_lock
    from vit.exits import RunError

    no_launcher(monkeypatch)
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    run = tmp_path / "runs" / launch
    last = run / runs.CHECKPOINTS / "last.ckpt"
    write(last, 12, saved=200.0)
    first = runs.command_id(["--config", "smoke"])
    torch.save({**load(last), "vit": {"launch": launch, "command": first}}, last)
    elsewhere, earlier = tmp_path / "start.ckpt", run / runs.CHECKPOINTS / "epoch0.ckpt"
    write(elsewhere, 4, saved=100.0)
    write(earlier, 6, saved=150.0)
    second = runs.command_id(["--config", "smoke", "--model.optimizer.lr", "0.002"])
    refusal = (f"{run} holds a run already, which an earlier training command with this launch's name ({launch}) "
               f"wrote: give this command its own folder with --run NAME, or continue that run with --ckpt_path last")

    def opened(ckpt_path, command, attempt="0") -> tuple:
        monkeypatch.setenv(restarts, attempt)
        try:
            run, resume = runs.open_for_fit(tmp_path / "runs", ckpt_path, None, {}, {}, [], command)
        finally:
            run_lock.release()
        return run, resume and resume[0], resume and resume[1]["global_step"]

    for attempt in ("0", "1"):
        for ckpt_path in (None, str(elsewhere)):
            with pytest.raises(RunError) as refused:
                opened(ckpt_path, second, attempt)
            assert str(refused.value) == refusal
            assert not (run / run_lock.LOCK).exists()
    assert opened(str(earlier), second) == (run, earlier, 6)  # (a branch of the same run, as the user asked)
    for ckpt_path in (None, str(elsewhere), "last"):
        assert opened(ckpt_path, first, "1") == (run, last, 12)
    torch.save({**load(last), "vit": {"launch": launch}}, last)  # (an earlier version's: no command recorded)
    assert opened(None, second, "1") == (run, last, 12)
