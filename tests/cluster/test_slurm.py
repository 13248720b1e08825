"""The project's own scripts/slurm/train.sbatch, submitted for real to SLURM (a one-node cluster on this
machine: scripts/slurm/local_cluster.sh), from a fresh clone, on small generated data, CPU only."""

import re
import subprocess
import time

import pytest

from launch import DATA_ARGS, FINAL, job, log, max_abs_diff, sbatch, user_env, wait
from helpers import TEST_LINE, digest, load

SMOKE = ["--config", "smoke", *DATA_ARGS]


def data(fake_cifar_session) -> list[str]:
    return ["--data.root", str(fake_cifar_session)]


def test_a_fresh_clone_submits_and_completes_with_a_readable_log(clone, fake_cifar_session):
    """No .venv, no runs/, no folder for the log: the job installs, trains on 2 tasks (the smoke recipe
    says devices: 1; the allocation wins), tests once, and its log is plain lines."""
    assert not (clone / ".venv").exists() and not (clone / "runs").exists()
    job_id = sbatch(clone, *SMOKE, *data(fake_cifar_session), "--trainer.max_epochs", "2")
    record = wait(job_id, clone, timeout=900)
    out = log(clone, job_id)
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", out[-3000:]
    run = clone / "runs" / "smoke" / f"slurm-{job_id}"
    assert [p.name for p in (clone / "runs" / "smoke").iterdir()] == [run.name]
    assert f"SLURM job {job_id}: 2 process(es) per node on 1 node(s) (the allocation's; the recipe's devices 1 " \
           "overridden)" in out
    (best,) = (run / "checkpoints").glob("best-*.ckpt")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == sorted([best.name, "last.ckpt"])
    assert len(list((run / "wandb").glob("offline-run-*"))) == 1
    assert len(re.findall(TEST_LINE, out)) == 1
    assert "\r" not in out, "a progress bar wrote carriage returns into the log"
    assert re.search(r"\] epoch 1 validation: val/loss [\d.]+ val/acc [\d.]+", out)
    assert "Traceback" not in out and "sync_dist=True" not in out


def test_vit_runs_puts_a_jobs_run_and_log_on_scratch_and_nothing_in_the_clone(clone, fake_cifar_session, tmp_path):
    """docs/clusters.md's first lines: VIT_RUNS exported, the log's place on sbatch's line; the job's run
    folder, its W&B files and its log are all on "scratch", and the clone gets no runs/ and no log."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()  # (SLURM makes no folder for a log)
    before = {p.name for p in clone.iterdir()}
    job_id = sbatch(clone, *SMOKE, *data(fake_cifar_session), "--trainer.max_epochs", "1", tasks=1,
                    env=user_env(VIT_RUNS=str(scratch)), options=("--output", f"{scratch}/slurm-%j.out"))
    record = wait(job_id, clone, timeout=900)
    out = (scratch / f"slurm-{job_id}.out").read_text(errors="replace")
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", out[-3000:]
    run = scratch / "smoke" / f"slurm-{job_id}"
    assert (run / "checkpoints/last.ckpt").is_file() and len(list((run / "wandb").glob("offline-run-*"))) == 1
    new = {p.name for p in clone.iterdir()} - before  # (.venv and the package's files where this job installed)
    assert "runs" not in new and not [name for name in new if name.startswith("slurm-")], new


def test_a_one_task_job_has_its_own_run_and_resumes_another_only_when_named(clone, fake_cifar_session):
    args = [*SMOKE, *data(fake_cifar_session)]
    first = sbatch(clone, *args, "--trainer.max_epochs", "1", tasks=1)
    assert wait(first, clone)["JobState"] == "COMPLETED", log(clone, first)[-3000:]
    first_run = clone / "runs" / "smoke" / f"slurm-{first}"
    before = digest(first_run)
    second = sbatch(clone, *args, "--trainer.max_epochs", "2", tasks=1)  # the script says --ckpt_path last
    assert wait(second, clone)["JobState"] == "COMPLETED", log(clone, second)[-3000:]
    assert f"run folder: runs/smoke/slurm-{second}" in log(clone, second)
    assert load(clone / "runs" / "smoke" / f"slurm-{second}" / "checkpoints" / "last.ckpt")["epoch"] == 1
    assert digest(first_run) == before  # the other job's run, untouched
    named = sbatch(clone, *args, "--trainer.max_epochs", "2", "--run", f"slurm-{first}", tasks=1)
    assert wait(named, clone)["JobState"] == "COMPLETED", log(clone, named)[-3000:]
    assert f"resuming runs/smoke/slurm-{first} from its last.ckpt" in log(clone, named)
    assert load(first_run / "checkpoints" / "last.ckpt")["epoch"] == 1
    assert not (clone / "runs" / "smoke" / f"slurm-{named}").exists()


def test_sigusr1_in_the_first_epoch_requeues_the_job_which_resumes_from_the_stop_step(clone, fake_cifar_session):
    """What `#SBATCH --signal=SIGUSR1@90` does before a time limit, sent in the middle of the first epoch of
    a 2-task job (7 steps per epoch; no epoch has ended, no step checkpoint is due): both tasks write the
    stop step's checkpoint, the requeued job resumes from it, executes the remaining steps only, and
    ends with the uninterrupted job's weights, in one W&B run. (Both tasks wait at the end of step 2 until the
    signal comes, before vit looks for it there: the stop step is 2 on any machine.)"""
    args = [*SMOKE, *data(fake_cifar_session), "--data.batch_size", "50", "--trainer.max_epochs", "2",
            "--trainer.log_every_n_steps", "1", "--trainer.callbacks+=callbacks.CountSteps"]
    whole = sbatch(clone, *args)
    assert wait(whole, clone)["JobState"] == "COMPLETED", log(clone, whole)[-3000:]
    job_id = sbatch(clone, *args, "--trainer.callbacks+=callbacks.HoldAtStep")
    run = clone / "runs" / "smoke" / f"slurm-{job_id}"
    deadline = time.monotonic() + 600
    try:
        while not all((run / f"held.{rank}").exists() for rank in (0, 1)):
            assert time.monotonic() < deadline and job(job_id).get("JobState") not in FINAL, \
                log(clone, job_id)[-3000:]
            time.sleep(0.2)
    except AssertionError:
        subprocess.run(["scancel", job_id])  # (not left waiting at step 2 for the next tests)
        raise
    subprocess.run(["scancel", "--signal=USR1", job_id], check=True)
    record = wait(job_id, clone)
    out = log(clone, job_id)
    assert record["JobState"] == "COMPLETED" and record["Restarts"] == "1", out[-4000:]
    stop = re.search(rf"stopped: SLURM job {job_id} got SIGUSR1 .*: stopped at step (\d+), in epoch 0, and saved it "
                     rf"to \S+step.ckpt \([\d.]+ s\)\. Requeued", out)
    assert stop and int(stop.group(1)) == 2, out[-4000:]
    assert f"requeueing job {job_id}" in out and f"job {job_id} (restart 1)" in out
    assert f"resuming runs/smoke/slurm-{job_id} from its step.ckpt" in out
    assert "Traceback" not in out
    ours, theirs = load(run / "checkpoints" / "last.ckpt"), load(clone / "runs/smoke" / f"slurm-{whole}/checkpoints/last.ckpt")
    assert ours["epoch"] == theirs["epoch"] == 1 and ours["global_step"] == theirs["global_step"] == 14
    delta = max_abs_diff(ours["state_dict"], theirs["state_dict"])
    for rank in (0, 1):  # steps executed over both attempts: the uninterrupted job's, the stop step at most once more
        executed = (run / f"steps.{rank}").read_text().split()
        uninterrupted = (clone / "runs/smoke" / f"slurm-{whole}" / f"steps.{rank}").read_text().split()
        assert len(uninterrupted) == 14 and 14 <= len(executed) <= 15, executed
    print(f"job {job_id} stopped at step {stop.group(1)}, requeued once; max |dw| against job {whole}: {delta}; "
          f"steps executed: {len(executed)}")
    assert delta == 0
    wandb_runs = sorted((run / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == 2 and len({r.name.rsplit("-", 1)[1] for r in wandb_runs}) == 1  # one W&B run


def test_the_local_cluster_script_is_idempotent(slurm):
    """README's `sudo bash scripts/slurm/local_cluster.sh`, run again on a cluster it started: nothing to
    restart, the node stays up."""
    import os

    from launch import ROOT

    if os.geteuid() != 0:
        pytest.skip("local_cluster.sh installs packages and starts daemons: run as root")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "slurm" / "local_cluster.sh")], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"local SLURM cluster up: node \S+, \d+ CPUs \(local\* (idle|mixed|allocated)\)", proc.stdout)


def test_an_interactive_step_of_several_tasks_is_refused_and_a_pty_shell_tests(slurm, fake_cifar_session,
                                                                             trained_checkpoint, tmp_path):
    """In an interactive job (salloc: its steps are named "interactive", which Lightning does not take for a
    SLURM launch), `srun -n 2 python scripts/train.py` would train 2 separate runs: it is refused in one line,
    before any folder. Named (`srun --job-name vit`), the step needs --ntasks-per-node, as Lightning does (one
    line, not its traceback), and with it trains one run on its 2 tasks. In an `srun -n 2 --pty bash` shell,
    whose other task ends, what one types runs once: `test` evaluates there."""
    import shutil
    import sys

    from launch import ROOT

    train = [sys.executable, str(ROOT / "scripts" / "train.py"), "--config", "smoke", *DATA_ARGS,
             "--data.root", str(fake_cifar_session), "--trainer.logger", "false"]
    refusals = {("-n", "2"): "this srun step starts 2 tasks in an interactive job (named interactive), which "
                             "Lightning would train as 2 separate runs: name the step to train one run on all of "
                             "them (srun --job-name NAME --ntasks-per-node 2), or start one task",
                ("--job-name", "vit", "-n", "2"): "this SLURM job runs 2 tasks and says no tasks per node, which "
                                                  "Lightning needs: ask for them with --nodes and --ntasks-per-node "
                                                  "instead of --ntasks"}
    for step, refusal in refusals.items():
        out = subprocess.run(["salloc", "-n", "2", "srun", *step, *train], cwd=tmp_path, env=user_env(),
                             capture_output=True, text=True, timeout=300)
        said = out.stdout + out.stderr
        assert [line for line in said.splitlines() if line.startswith("error:")] == [f"error: {refusal}"], said[-3000:]
        assert out.returncode == 2 and "Traceback" not in said and not (tmp_path / "runs").exists()
    named = subprocess.run(["salloc", "-n", "2", "srun", "--job-name", "vit", "--ntasks-per-node", "2", *train,
                            "--trainer.max_epochs", "1", "--test_after_fit", "false"],
                           cwd=tmp_path, env=user_env(), capture_output=True, text=True, timeout=300)
    said = named.stdout + named.stderr
    assert named.returncode == 0, said[-3000:]
    (run,) = (tmp_path / "runs" / "smoke").iterdir()  # one run, of both tasks
    assert run.name.startswith("slurm-") and "2 process(es) per node on 1 node(s)" in said
    shutil.copy(trained_checkpoint, tmp_path / "trained.ckpt")
    typed = " ".join([*train[:2], "test", "--ckpt_path", "trained.ckpt", *train[4:]])
    shell = subprocess.run(["script", "-qec", "srun -n 2 --pty bash", "/dev/null"], input=f"{typed}; exit $?\n",
                           cwd=tmp_path, env=user_env(), capture_output=True, text=True, timeout=300)
    assert shell.returncode == 0 and re.search(TEST_LINE, shell.stdout), shell.stdout[-3000:]
