"""`vit-plan` / `python scripts/plan.py`: run a plan of training runs (a grid of recipe changes × seeds,
written as a YAML file) on this machine or as one SLURM job array, and render its table of mean and spread
over seeds from the runs' own records.

    vit-plan show my-sweep.yaml                  the runs it expands to, numbered (a job array's task ids), each
                                                 with the vit-train command that runs it
    vit-plan run my-sweep.yaml                   run them here, one after the other (resources.at_once: a few
                                                 at once, one CPU core each); a run with its record is skipped,
                                                 one whose record is of another command (an edited plan) is
                                                 moved aside (RUNS/TABLE/NAME.replaced-N) and runs again
    vit-plan submit my-sweep.yaml                one SLURM job array, one task per run, each with the plan's
                                                 resources: writes RUNS/TABLE/TABLE.sbatch, prints it, sbatch;
                                                 a task stopped by a time limit requeues and continues
    vit-plan submit my-sweep.yaml --dry-run      only write and print the script
    vit-plan table my-sweep.yaml                 mean ± standard deviation over seeds, and n, per change, from
                                                 the records of the plan's commands only

A plan file (`vit-plan show --help` has the whole schema):

    # what it measures
    args: [--config, cpu]                        # the recipe every run starts from (vit-train's arguments)
    seeds: [0, 1]                                # each run once per seed
    minutes: 10                                  # each run's budget (--trainer.max_time)
    resources: {cpus: 2, gpus: 0, memory: 8G, time: "00:30:00"}
    runs:
      - {name: base, label: the cpu recipe}
      - {name: nowd, label: + no weight decay, args: [--model.optimizer.weight_decay, 0]}

The plan's seeds, minutes and data come after each run's args: no recipe file in them overrides them.
Each run trains in RUNS/TABLE/NAME/ (default: $VIT_RUNS/TABLE/NAME/, else runs/TABLE/NAME/; TABLE the file's
name), continuing a run that stopped (--ckpt_path last); its record is that folder's results.json, with the
run's configuration. Every run of a plan logs to one W&B group, named TABLE.

Exit status: 0 done; 1 a run failed (its own output says why); 2 a bad argument or plan file (one line
naming the file and the key); 4 a run stopped where it resumes (a signal, a time limit) or --max-commands
stopped the plan: the same command continues.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from vit.failures import exit_on_failure
from vit.cluster.runs import runs_folder


def _parser() -> argparse.ArgumentParser:
    from vit import plans

    parser = argparse.ArgumentParser(prog="vit-plan", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{show,run,submit,table}")

    def command(name: str, text: str, **kwargs) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text, description=text, **kwargs)
        p.add_argument("plan", help="a plan file (YAML), or the name of one in the repository's experiments/")
        return p

    p = command("show", "the runs a plan expands to, numbered, each with the command that runs it",
                epilog=plans.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=Path, default=runs_folder(),
                   help="where the runs' folders go (default: $VIT_RUNS, else runs)")
    p.add_argument("--data-root", type=Path, default=Path("data"),
                   help="the data root every run trains on (default: data)")
    for name, text in (("run", "run the plan's runs on this machine"),
                       ("submit", "submit the plan as one SLURM job array, one task per run")):
        p = command(name, text)
        p.add_argument("--runs", type=Path, default=runs_folder(),
                       help="where the runs' folders go (default: $VIT_RUNS, else runs)")
        p.add_argument("--data-root", type=Path, default=Path("data"),
                       help="the data root every run trains on (--data.root; default: data)")
        if name == "run":
            p.add_argument("--results", type=Path, default=None,
                           help="also copy each run's record to RESULTS/TABLE/NAME.json (a run with one there is "
                                "skipped)")
            p.add_argument("--index", type=int, default=None,
                           help="run only the plan's run INDEX (vit-plan show numbers them; a job array's task id)")
            p.add_argument("--max-commands", type=int, default=None, help="stop after this many commands (exit 4)")
        else:
            p.add_argument("--dry-run", action="store_true",
                           help="only write and print the script: no sbatch, and nothing else is made (no checkout "
                                "of a run's commit, no data fetched or converted)")
    p = command("table", "the plan's table: mean ± standard deviation over seeds, and n, for each run")
    p.add_argument("--runs", type=Path, default=runs_folder(), help="the runs' folders (default: $VIT_RUNS, else runs)")
    p.add_argument("--results", type=Path, default=None, help="read the records copied to RESULTS/TABLE/NAME.json instead")
    return parser


def _show(plan, runner) -> str:
    """Each run numbered, with the command that runs it: vit-train's arguments exactly as `run` and `submit`
    give them (``Runner.train_args``)."""
    import shlex

    from vit.plans import Benchmark

    lines = [f"{plan.path}: table {plan.table}, {len(plan.runs)} run(s), W&B group {plan.table}"]
    for i, job in enumerate(plan.runs):
        bench = isinstance(job, Benchmark)
        what = "vit-benchmark" if bench else "vit-train"
        commit = f" (commit {job.commit})" if getattr(job, "commit", None) else ""
        lines.append(f"{i:4d}  {job.name}: {job.label}{commit}\n      {what} "
                     f"{shlex.join(job.args if bench else runner.train_args(job))}")
    return "\n".join(lines)


def check_arguments(plan, runner) -> None:
    """Each run's command parsed by the parser of its command (vit-train's, vit-benchmark's), as it would
    parse it, before any work starts: a typo or an old option is one line naming the plan file and the run
    (ConfigError). A run of another commit (commit:) takes that commit's options: not checked here. Which
    recipe runs where a plan names none (``Runner.recipe``) is said once."""
    from vit.exits import ConfigError
    from vit.plans import Benchmark

    resolved = None
    for job in plan.runs:
        if getattr(job, "commit", None):
            continue
        try:
            if isinstance(job, Benchmark):
                _check_benchmark(list(job.args))
                continue
            runner.configuration(job)
        except ConfigError as e:
            raise ConfigError(f"{plan.path}: run {job.name}: {e}") from None
        resolved = resolved or runner.recipe(job)
    if resolved:
        print(f"[plan] {_resolved(resolved, plan.resources['gpus'])}; name a recipe in the plan's args to choose "
              "another")


def _resolved(recipe: str, gpus: int) -> str:
    """Why runs that name no recipe train ``recipe`` (``Runner.recipe``)."""
    why = f"the plan gives each {gpus} GPU(s) (resources.gpus)" if gpus else \
        "the plan gives them no GPU (resources.gpus is 0)"
    return f"runs that name no recipe train {recipe} (--config {recipe}): {why}"


def _check_benchmark(argv: list[str]) -> None:
    from vit.commands.benchmark import parser
    from vit.exits import ConfigError

    on_error, parser.exit_on_error = parser.exit_on_error, False
    try:
        _, extra = parser.parse_known_args(argv)
    except argparse.ArgumentError as e:
        raise ConfigError(f"vit-benchmark: {e}") from None
    finally:
        parser.exit_on_error = on_error
    if extra:
        raise ConfigError(f"vit-benchmark: unrecognized arguments: {' '.join(extra)}")


@exit_on_failure
def main(argv: list[str] | None = None) -> int:
    from vit import plans
    from vit.reporting.plan_table import summary
    from vit.exits import ConfigError

    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    from vit.commands.train import ArgumentCheck

    plan = plans.load(plans.find(args.plan))
    results_dir = getattr(args, "results", None)
    runner = plans.Runner(getattr(args, "data_root", Path("data")).resolve(), args.runs.resolve(),
                          results_dir and results_dir.resolve(), max_commands=getattr(args, "max_commands", None),
                          check_command=ArgumentCheck())
    if args.command != "table" and not plan.history:
        check_arguments(plan, runner)
    if args.command == "show":
        print(_show(plan, runner))
        return 0
    if args.command == "table":
        print(f"{plan.path}: mean ± standard deviation over seeds; n: the runs with a record of the plan's "
              "command, of those planned")
        print(summary(plan, runner), end="")
        return 0
    if plan.history:
        raise ConfigError(f"{plan.path}: history: a plan kept for its records; it does not run")
    if args.command == "submit":
        return submit(plan, args, runner)
    if args.index is not None and not 0 <= args.index < len(plan.runs):
        raise ConfigError(f"--index {args.index}: the plan has runs 0 to {len(plan.runs) - 1} (vit-plan show)")
    if not runner.run_plan(plan, args.index):
        print(f"[plan] stopped after {runner.commands} command(s) (--max-commands): run the same command again "
              "to continue", file=sys.stderr)
        return plans.STOPPED
    return 0


def submit(plan, args, runner) -> int:
    from vit import plans

    runner.dry_run = args.dry_run  # commands only: no checkout, no data made
    script = runner.runs_root / plan.table / f"{plan.table}.sbatch"
    text = plans.sbatch_script(plan, runner)  # (a run that cannot start is refused before anything is written)
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(text)
    print(f"[plan] {script}:\n{script.read_text()}", end="", flush=True)
    if args.dry_run:
        return 0
    if shutil.which("sbatch") is None:
        print("error: no sbatch here (SLURM's): submit from a login node of the cluster, or use --dry-run to only "
              "write the script", file=sys.stderr)
        return 2
    runner.cifar(plan)  # the tasks would each fetch it into one folder: once, here, before they start
    runner.settle(list(plan.runs))  # a record of another command: moved aside, so that its task runs it again
    for job in plan.runs:
        runner.remember(job)  # what each task starts: a later submit of an edited plan tells it
    done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
    if done.returncode:
        print(f"error: sbatch refused {script}: {done.stderr.strip()}", file=sys.stderr)
        return 1
    job = done.stdout.strip().split(";")[0]
    print(f"[plan] submitted job array {job}: {len(plan.runs)} task(s); when they are done, "
          f"`vit-plan table {plan.path}{' --runs ' + str(args.runs) if args.runs != runs_folder() else ''}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
