"""scripts/slurm/train.sbatch's own logic, run by bash with stand-ins for srun and scontrol on PATH (the real
jobs are in tests/cluster/test_slurm.py): a stopped job requeues itself up to VIT_MAX_REQUEUES times, then
says so in one line."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "slurm" / "train.sbatch"


@pytest.fixture
def job(tmp_path):
    """Runs the script as SLURM would run job 77 after ``restarts`` requeues; srun exits ``status``."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    calls = tmp_path / "scontrol.calls"
    (bin_ / "srun").write_text(f"#!/bin/sh\necho \"$VIT_REQUEUER\" > {tmp_path}/requeuer\n"
                               "[ -z \"$SRUN_SIGNALS_SHELL\" ] || kill -USR1 $PPID\nexit \"$SRUN_STATUS\"\n")
    (bin_ / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    for tool in bin_.iterdir():
        tool.chmod(0o755)
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed").write_text("SYSTEM_SITE= WHEELS=\n")  # installed: the job trains at once

    def run(restarts: int, status: int = 4, cap: str | None = None, *args: str, env: dict | None = None):
        extra = env or {}
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "VIT_"))}
        env.update(PATH=f"{bin_}:{env['PATH']}", SLURM_SUBMIT_DIR=str(tmp_path), SLURM_JOB_ID="77",
                   SLURM_JOB_NODELIST="node1", SLURM_RESTART_COUNT=str(restarts), SRUN_STATUS=str(status),
                   VIT_VENV=str(venv))
        if cap is not None:
            env["VIT_MAX_REQUEUES"] = cap
        env.update(extra)
        proc = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
        requeues = calls.read_text().splitlines() if calls.exists() else []
        calls.unlink(missing_ok=True)
        return proc, requeues

    return run


def test_a_stopped_job_requeues_itself_until_the_default_cap(job):
    proc, requeues = job(restarts=19)
    assert proc.returncode == 4 and requeues == ["requeue 77"], proc.stdout + proc.stderr
    assert "requeueing job 77: it resumes from its run folder's newest checkpoint" in proc.stdout
    proc, requeues = job(19, 0)  # a job that ends is never requeued
    assert proc.returncode == 0 and requeues == []
    proc, requeues = job(20, 4, None, "--config", "smoke", "--data.root", "my data")
    assert proc.returncode == 4 and requeues == [], proc.stdout
    (line,) = [line for line in proc.stdout.splitlines() if "requeu" in line]
    assert line == ("not requeueing job 77: it was requeued 20 times (VIT_MAX_REQUEUES=20); continue its run with "
                    "the same sbatch options: sbatch scripts/slurm/train.sbatch --config smoke --data.root my\\ data "
                    "--run slurm-77")
    proc, _ = job(20, 4, None, "--run", "mine")  # the run the user named: no second --run
    assert proc.stdout.rstrip().endswith("sbatch scripts/slurm/train.sbatch --run mine"), proc.stdout
    proc, _ = job(20, 4, None, "--ckpt_path", "start.ckpt", "--ckpt_path=x.ckpt", "--config", "smoke")
    assert proc.stdout.rstrip().endswith("train.sbatch --config smoke --run slurm-77"), proc.stdout  # not FILE again
    proc, _ = job(20, 4, None, env={"SLURM_ARRAY_JOB_ID": "70", "SLURM_ARRAY_TASK_ID": "3"})  # an array's task
    assert proc.stdout.rstrip().endswith("sbatch scripts/slurm/train.sbatch --run slurm-70_3"), proc.stdout


def test_the_cap_is_settable_and_a_bad_one_is_refused_before_training(job):
    assert job(2, 4, "3")[1] == ["requeue 77"]
    proc, requeues = job(3, 4, "3")
    assert requeues == [] and "it was requeued 3 times (VIT_MAX_REQUEUES=3)" in proc.stdout
    assert job(0, 4, "0")[1] == []  # 0: never
    proc, requeues = job(0, 4, "ten")
    assert proc.returncode == 2 and requeues == [] and proc.stdout == ""
    assert proc.stderr == "VIT_MAX_REQUEUES=ten: give a number of requeues (0: never requeue)\n"


def test_the_script_names_partition_account_qos_and_gres_for_clusters_that_want_them():
    text = SCRIPT.read_text()
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    commented = [line for line in text.splitlines() if line.startswith("##SBATCH")]
    assert {line.split("=")[0] for line in commented} == {"##SBATCH --partition", "##SBATCH --account",
                                                          "##SBATCH --qos"}
    assert "#SBATCH --gpus-per-node=4" in directives and "`#SBATCH --gres=gpu:4`" in text


def test_a_sigusr1_to_the_batch_shell_too_still_requeues_and_the_run_is_told_who_requeues(job, tmp_path):
    """`scancel --full --signal=USR1` (or `--signal=B:USR1@90`) signals the batch shell as well as the run: the
    shell lives through it (without a trap bash dies of it, exit 138, and the job ends FAILED, never requeued)."""
    proc, requeues = job(0, 4, env={"SRUN_SIGNALS_SHELL": "1"})
    assert proc.returncode == 4 and requeues == ["requeue 77"], proc.stdout + proc.stderr
    assert (tmp_path / "requeuer").read_text() == "scripts/slurm/train.sbatch\n"  # the stop line names it


def test_a_sigusr1_before_training_stops_with_exit_4_which_the_script_requeues(monkeypatch, capsys):
    """SLURM's SIGUSR1 can come while vit-train still starts (imports, data, an image folder's check): the process
    stops at once with exit 4 and one line (the job's script requeues it), never dies by the signal (exit 138)."""
    import signal

    from helpers import SLURM_TASK
    from vit.commands import train

    class SignalledWhileStarting:
        def __init__(self, *args):
            os.kill(os.getpid(), signal.SIGUSR1)
            raise AssertionError("the signal was not handled")

    for key, value in SLURM_TASK.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(train, "ViTCLI", SignalledWhileStarting)
    handler = signal.getsignal(signal.SIGUSR1)
    try:
        assert train.main(["--config", "smoke"]) == 4
    finally:
        signal.signal(signal.SIGUSR1, handler)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("stopped: SIGUSR1 (SLURM's notice of a time limit or a preemption) came before training")
