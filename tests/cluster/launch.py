"""Helpers of the multi-process tests: a fresh clone of the tree, jobs on the local SLURM cluster
(scripts/slurm/local_cluster.sh), and runs whose output goes to a terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import shlex
import shutil
import struct
import subprocess
import termios
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
DATA_ARGS = ["--data.val_size", "101", "--data.num_workers", "0", "--data.batch_size", "50"]
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
         "PREEMPTED"}


def user_env(**extra: str) -> dict:
    """A user's environment: W&B with no credentials (so: offline, as for a new user), test callbacks
    importable (`--trainer.callbacks+=callbacks.X`), and this tree's vit, whichever tree the environment installed."""
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "WANDB_MODE", "VIT_RUN_DIR",
                                                                   "VIT_RUNS")}
    env.update(WANDB_SILENT="true", PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT)]), **extra)
    return env


def fresh_clone(dst: Path) -> Path:
    """`git clone` of this tree, plus its uncommitted changes (so a change is tested before its commit):
    no .venv, no runs/, no data/ — what a user has after cloning."""
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dst)], check=True)
    listed = subprocess.run(["git", "ls-files", "-z", "-m", "-o", "--exclude-standard"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.split("\0")
    for rel in filter(None, listed):
        source, target = ROOT / rel, dst / rel
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        elif target.exists():
            target.unlink()
    return dst


def sbatch(clone: Path, *args: str, tasks: int = 2, env: dict | None = None, options: tuple[str, ...] = ()) -> str:
    """Submit the project's own scripts/slurm/train.sbatch, unchanged, from ``clone``; sbatch's options
    on the command line (``options``: more of them) override its #SBATCH lines (no GPUs here)."""
    cmd = ["sbatch", "--parsable", "--nodes=1", f"--ntasks-per-node={tasks}", "--gpus-per-node=0",
           "--cpus-per-task=1", *options, "scripts/slurm/train.sbatch", *args]
    proc = subprocess.run(cmd, cwd=clone, env=env or user_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def job(job_id: str) -> dict[str, str]:
    """scontrol's record of a job (kept MinJobAge=600 s after it ends), as key → value."""
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def wait(job_id: str, clone: Path, timeout: float = 600) -> dict[str, str]:
    """Wait for the job to end; a job still running after ``timeout`` s is cancelled and fails the test."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = job(job_id)
        if record.get("JobState") in FINAL:
            return record
        time.sleep(2)
    subprocess.run(["scancel", job_id])
    raise AssertionError(f"job {job_id} still {job(job_id).get('JobState')} after {timeout} s:\n"
                         f"{log(clone, job_id)[-3000:]}")


def log(clone: Path, job_id: str) -> str:
    path = clone / f"slurm-{job_id}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def in_terminal(cmd: list[str], cwd: Path, env: dict, timeout: float) -> tuple[int | None, str, float]:
    """Run ``cmd`` with stdout and stderr on a pseudo-terminal, as a user's shell does (so the progress
    bar is tqdm's). Returns (exit status or None if it was still running at ``timeout`` and was killed,
    output, seconds)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a 120-column terminal
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    chunks = []
    while time.monotonic() - start < timeout:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # every writer closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    try:
        code = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - start)))
    except subprocess.TimeoutExpired:  # still running: a hang. Kill the whole session (Lightning's rank 1 too)
        code = None
        os.killpg(proc.pid, 9)
        proc.wait()
    os.close(master)
    return code, b"".join(chunks).decode(errors="replace"), time.monotonic() - start


def run_together(cmds: list[list[str]], cwd: Path, env: dict, timeout: float) -> tuple[list[int | None], str]:
    """Start ``cmds`` at once, each in a session of its own, and wait for all of them (at most ``timeout`` s in
    all). Returns their exit statuses and their output (stdout and stderr), in order. A command still running at
    ``timeout`` is a hang: every process of its session (Lightning's rank 1, torchrun's workers) gets SIGABRT,
    on which Python's faulthandler (PYTHONFAULTHANDLER) prints each thread's stack to the output, then SIGKILL;
    its status is None, and the output says where each process was."""
    import signal
    import threading

    env = {**env, "PYTHONFAULTHANDLER": "1"}
    procs = [subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, start_new_session=True) for cmd in cmds]
    outs: list[list[bytes]] = [[] for _ in procs]
    readers = [threading.Thread(target=lambda p=p, o=o: o.extend(iter(lambda: p.stdout.read1(65536), b"")), daemon=True)
               for p, o in zip(procs, outs)]
    for reader in readers:
        reader.start()
    deadline, codes = time.monotonic() + timeout, []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    for proc, code in zip(procs, codes):
        if code is None:
            for sig, grace in ((signal.SIGABRT, 10), (signal.SIGKILL, 0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                time.sleep(grace)
            proc.wait()
    for reader in readers:
        reader.join(timeout=10)
    texts = [b"".join(o).decode(errors="replace") for o in outs]
    heads = [f"still running after {timeout:.0f} s: the stacks of its processes follow (SIGABRT)" if code is None
             else f"exit {code}" for code in codes]
    return codes, "".join(f"--- {shlex.join(map(str, cmd))}: {head}\n{text}" for cmd, head, text in zip(cmds, heads, texts))


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)
