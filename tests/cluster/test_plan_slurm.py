"""vit-plan submit: a two-run plan becomes one SLURM job array on the local cluster
(scripts/slurm/local_cluster.sh), each task trains its run, and the plan's table is rendered from both
records; small generated data, CPU only."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from launch import FINAL, ROOT, user_env, wait
from launch import job as job_record


def test_a_two_run_plan_is_one_job_array_whose_tasks_leave_both_records_and_the_table(slurm, tmp_path,
                                                                                       fake_cifar_session):
    toy = ["--config", "smoke", "--model.arch.dim", "16", "--model.arch.depth", "1", "--model.arch.heads", "2",
           "--trainer.max_epochs", "1", "--data.batch_size", "50", "--data.val_size", "100",
           "--data.num_workers", "0"]
    plan = tmp_path / "pair.yaml"
    plan.write_text(f"""# the toy recipe against it without weight decay
args: {json.dumps(toy)}
seeds: [0]
resources: {{cpus: 1, time: "00:20:00"}}
runs:
  - {{name: base, label: the toy recipe}}
  - {{name: nowd, label: + no weight decay, args: [--model.optimizer.weight_decay, 0]}}
""")
    runs = tmp_path / "runs"

    def plan_command(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(ROOT / "scripts" / "plan.py"), *args], cwd=tmp_path,
                              env=user_env(), capture_output=True, text=True, timeout=120)

    submitted = plan_command("submit", str(plan), "--runs", str(runs), "--data-root", str(fake_cifar_session))
    assert submitted.returncode == 0, submitted.stderr
    assert "#SBATCH --array=0-1" in submitted.stdout and (runs / "pair" / "pair.sbatch").is_file()
    job = re.search(r"submitted job array (\d+): 2 task\(s\)", submitted.stdout).group(1)
    for task in (0, 1):
        record = wait(f"{job}_{task}", runs / "pair", timeout=900)
        out = (runs / "pair" / f"slurm-{job}_{task}.out").read_text(errors="replace")
        assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", out[-3000:]
        assert record["NumCPUs"] == "1"
        assert f"task {task} of pair.yaml" in out and "Traceback" not in out
    for name in ("base-s0", "nowd-s0"):  # each task ran its own run, once
        result = json.loads((runs / "pair" / name / "results.json").read_text())
        assert ("--model.optimizer.weight_decay 0" in result["command"]) == name.startswith("nowd")
        assert 0 <= result["test_top1"] <= 100
    table = plan_command("table", str(plan), "--runs", str(runs))
    assert table.returncode == 0, table.stderr
    assert re.search(r"^\| the toy recipe \| the plan's \| 1 of 1 \| \d+\.\d\d \|", table.stdout, re.M)
    assert re.search(r"^\| \+ no weight decay \| `--model.optimizer.weight_decay 0` \| 1 of 1 \| \d+\.\d\d \|", table.stdout,
                     re.M)


def plan_env() -> dict:
    """A user's environment (W&B on, offline without credentials), this tree's vit first."""
    import os

    env = user_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env["PYTHONPATH"]])
    return env


def submit(plan: Path, runs: Path, data: Path) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "plan.py"), "submit", str(plan), "--runs", str(runs),
                           "--data-root", str(data)], cwd=plan.parent, env=plan_env(), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    return re.search(r"submitted job array (\d+)", done.stdout).group(1)


def toy_plan(path: Path, runs: str, hold: str | None = None) -> Path:
    """The toy recipe with the defaults (W&B on, the progress bar as the plan leaves it; 8 steps an epoch, 2
    epochs), each step executed written to the run's steps.0; with ``hold``, every run waits at step 2 (HoldAtStep)
    until SIGUSR1 comes (``hold="signal"``) or until its folder has a file ``go`` (``hold="go"``)."""
    toy = ["--config", "smoke", "--model.arch.dim", "16", "--model.arch.depth", "1", "--model.arch.heads", "2",
           "--trainer.max_epochs", "2", "--data.batch_size", "50", "--data.val_size", "100", "--data.num_workers", "0",
           "--trainer.callbacks+=callbacks.CountSteps",
           *(["--trainer.callbacks+=callbacks.HoldAtStep", "--trainer.callbacks.until", hold] if hold else [])]
    path.write_text(f"args: {json.dumps(toy)}\nresources: {{cpus: 1, time: \"00:20:00\"}}\nruns: {runs}\n")
    return path


def steps(run: Path) -> list[str]:
    return (run / "steps.0").read_text().split() if (run / "steps.0").exists() else []


def wait_for_file(path: Path, task: str, log: Path) -> None:
    """Until ``path`` exists; the test fails (and ``task`` is cancelled) if the task ends first, or after 600 s."""
    deadline = time.monotonic() + 600
    while not path.exists():
        if time.monotonic() > deadline or job_record(task).get("JobState") in FINAL:
            subprocess.run(["scancel", task])  # (not left waiting for the next tests)
            raise AssertionError(log.read_text(errors="replace")[-3000:] if log.exists() else "no log")
        time.sleep(0.2)


def test_a_plans_task_signalled_mid_epoch_stops_requeues_and_completes(slurm, tmp_path, fake_cifar_session):
    """SIGUSR1 to task 0 of a real two-task array in its first epoch, to its batch shell too (`scancel --full`, as
    `--signal=B:...` would): the run stops where it resumes (exit 4), the task requeues and completes, the other
    task is untouched, each run has its record, one W&B run each. (Task 0 waits at step 2 until the signal comes,
    so it stops at the same step on any machine.)"""
    plan = toy_plan(tmp_path / "pair.yaml", "[{name: base, args: ['--trainer.callbacks+=callbacks.HoldAtStep']}, "
                                             "{name: nowd, args: [--model.optimizer.weight_decay, 0]}]")
    runs = tmp_path / "runs"
    job = submit(plan, runs, fake_cifar_session)
    run, log = runs / "pair" / "base", runs / "pair" / f"slurm-{job}_0.out"
    wait_for_file(run / "held.0", f"{job}_0", log)
    subprocess.run(["scancel", "--full", "--signal=USR1", f"{job}_0"], check=True)
    records = {task: wait(f"{job}_{task}", runs / "pair", timeout=900) for task in (0, 1)}
    out = log.read_text(errors="replace")
    assert records[0]["JobState"] == "COMPLETED" and records[0]["Restarts"] == "1", out[-4000:]
    assert records[1]["JobState"] == "COMPLETED" and records[1]["Restarts"] == "0"
    stop = re.search(r"stopped: SLURM job \S+ got SIGUSR1 .*: stopped at step (\d+), in epoch 0, and saved it to "
                     r"\S+step\.ckpt \([\d.]+ s\)\. Requeued by the job array of pair\.yaml \(vit-plan submit\) under "
                     r"the same id", out)
    # the processes look for a signal every log_every_n_steps steps (the smoke recipe's 5): the first look after it
    assert stop and int(stop.group(1)) == 5, out[-4000:]
    assert "requeueing task 0" in out and "task 0 of pair.yaml (restart 1)" in out
    assert f"resuming {run} from its step.ckpt" in out and "Traceback" not in out
    executed = steps(run)
    assert set(executed) == {str(s) for s in range(1, 17)}, executed  # every step of 2 epochs, none lost
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 16
    for name in ("base", "nowd"):
        result = json.loads((runs / "pair" / name / "results.json").read_text())
        assert result["epochs"] == 2 and 0 <= result["test_top1"] <= 100
    wandb_runs = sorted((run / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == 2 and len({r.name.rsplit("-", 1)[1] for r in wandb_runs}) == 1


def test_the_same_plan_submitted_again_while_its_array_runs_loses_nothing(slurm, tmp_path, fake_cifar_session):
    """The second array's task finds the run folder held by the first's: it ends at once with exit 2 and one line
    naming the holder, removing nothing; the first trains every step once and leaves one record."""
    # (the first waits at step 2 until the second has ended: still training when submitted again, on any machine)
    plan = toy_plan(tmp_path / "one.yaml", "[{name: base}]", hold="go")
    runs = tmp_path / "runs"
    first = submit(plan, runs, fake_cifar_session)
    run = runs / "one" / "base"
    wait_for_file(run / "held.0", f"{first}_0", runs / "one" / f"slurm-{first}_0.out")
    try:
        second = submit(plan, runs, fake_cifar_session)
        again = wait(f"{second}_0", runs / "one", timeout=600)
    finally:
        (run / "go").touch()  # the first goes on, whatever became of the second
    out = (runs / "one" / f"slurm-{second}_0.out").read_text(errors="replace")
    assert again["JobState"] == "FAILED" and again["ExitCode"] == "2:0", out[-3000:]
    (line,) = [line for line in out.splitlines() if line.startswith("error:")]
    assert re.fullmatch(rf"error: {run} is in use: another process trains in it \(pid \d+ on \S+ \(SLURM job "
                        rf"{first}_0\), since \S+\), and one process at a time trains in a run folder\. .*", line), line
    done = wait(f"{first}_0", runs / "one", timeout=900)
    first_out = (runs / "one" / f"slurm-{first}_0.out").read_text(errors="replace")
    assert done["JobState"] == "COMPLETED" and done["Restarts"] == "0", first_out[-3000:]
    assert steps(run) == [str(s) for s in range(1, 17)]  # every step once: nothing lost, nothing replayed
    result = json.loads((run / "results.json").read_text())
    assert result["epochs"] == 2 and "removed" not in first_out and "took over" not in first_out
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if not p.name.startswith("best-")) == ["last.ckpt"]
    assert len(list((run / "wandb").glob("offline-run-*"))) == 1  # the second started no W&B run
