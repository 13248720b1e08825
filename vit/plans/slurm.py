"""A plan as one SLURM job array (``vit-plan submit``): the sbatch script, task i running the plan's run i."""

from __future__ import annotations

import shlex

from vit.cluster.launch import array_script
from vit.plans.plan_file import REPO, Benchmark, Plan
from vit.plans.run_here import Runner


def sbatch_script(plan: Plan, runner: Runner) -> str:
    """One SLURM job array for the plan: task i runs the plan's run i alone (its vit-train or vit-benchmark
    command, as ``runner`` would start it here), with the resources the plan names. What the runs need is
    made now, on the machine that submits (a commit's checkout, Fashion-MNIST's folders), unless the runner
    only names it (``dry_run``); a benchmark's task makes its report's folder."""
    r = plan.resources
    out = runner.runs_root / plan.table
    commands = []
    for job in plan.runs:
        record = runner.own_record(job)
        folder = ""
        if isinstance(job, Benchmark):
            command, where, srun = runner.benchmark_command(job, record), REPO, "srun --ntasks=1"
            folder = f"mkdir -p {shlex.quote(str(record.parent))} && "  # its report's folder (benchmark-TABLE)
        else:
            command, where, srun = runner.train_command(job), runner.tree(job), "srun"
        prefix = folder + f"cd {shlex.quote(str(where))} && " + (
            f"PYTHONPATH={runner.pythonpath(where, shell=True)} " if getattr(job, "commit", None) else "")
        done = shlex.quote(f"{job.table}/{job.name}: done, its record is {record}")  # submitted again: not rerun
        commands.append(f"if [ -e {shlex.quote(str(record))} ]; then echo {done}; "
                        f"else {prefix}{srun} {shlex.join(command)} || status=$?; fi")
    lines = [
        "#!/bin/bash",
        f"# {plan.path.resolve()}: its {len(plan.runs)} runs as one SLURM job array, task i running the plan's run i",
        "# (`vit-plan show` numbers them), each in one W&B group; written by vit-plan submit. When they are done:",
        f"#   vit-plan table {shlex.quote(str(plan.path.resolve()))} --runs {shlex.quote(str(runner.runs_root))}",
        f"#SBATCH --job-name={plan.table}",
        f"#SBATCH --array=0-{len(plan.runs) - 1}",
        "#SBATCH --nodes=1",
        f"#SBATCH --ntasks-per-node={max(1, r['gpus'])}",
        f"#SBATCH --cpus-per-task={r['cpus']}",
        *([f"#SBATCH --gres=gpu:{r['gpus']}"] if r["gpus"] else []),
        *([f"#SBATCH --mem={r['memory']}"] if r["memory"] else []),
        *([f"#SBATCH --time={r['time']}"] if r["time"] else []),
        "#SBATCH --signal=SIGUSR1@90",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={out}/slurm-%A_%a.out",
        f"export WANDB_RUN_GROUP={shlex.quote(plan.table)}",
    ]
    return "\n".join(lines) + "\n" + array_script(plan.path.name, commands)
