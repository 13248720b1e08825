"""vit-plan submit: a two-run plan becomes one SLURM job array on the local cluster
(scripts/slurm/local_cluster.sh), each task trains its run, and the plan's table is rendered from both
records; small generated data, CPU only."""

import json
import re
import subprocess
import sys
from pathlib import Path

from launch import ROOT, user_env, wait


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
