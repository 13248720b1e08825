"""`vit-figures` / `python scripts/figures.py` (`make figures`): measure the figures of README and docs/ on
this machine, keep their records in results/, and render the pages' tables from them.

    make figures                                  this machine's plan (experiments/cpu.yaml, or gpu.yaml where
                                                  CUDA is), then the pages
    make figures ARGS="--plan cpu-folders"        one plan of experiments/ (its header says what it measures)
    make figures ARGS="--quick"                   every plan at toy scale on CPU, on generated data (a test runs it)
    make figures ARGS="--render"                  only re-render README and docs/ from results/
    make figures ARGS="--check"                   exit 1 if their tables differ from results/

Each page's block `<!-- figures: TABLE -->` is the table of the plan in experiments/ that fills TABLE,
rendered from the records in results/TABLE/. A row that has a record there is not measured again, and a
run whose folder exists (runs/figures/TABLE/ROW) is resumed: to measure a table again, delete both
(rm -r results/cpu runs/figures/cpu). A plan of your own runs with `vit-plan` (vit-plan --help).

Each training run and each benchmark runs whole, as one command. With --minutes M (where a job's time
is bounded), each command it runs ends within M minutes instead: a longer training
run stops at an epoch end with exit 4 and the next command continues it exactly (--ckpt_path last); a
benchmark stops with the sections it has not finished, which the next command measures (vit-benchmark
--minutes). With --max-commands N it stops after N commands (exit 4); the same make figures continues
where it stopped.

A plan may bound its time: each row's own budget (its minutes: a training run trains for that less a reserve
for start-up, compile and test, --trainer.max_time, and a benchmark runs with vit-benchmark --minutes; either
is killed at its end, with one line), and the whole plan's (budget_minutes, or --total-minutes): a row that
would not fit in what is left is skipped with one line and stays pending. A row its budget stopped says so in
its record ("budget") and in its table. The gpu plan ends within its 8.5 minutes this way; --scale S rehearses
it in S times its time (the rows' own commands, on this machine).

Exit status: 0 done; 1 a run failed (its own output says why) or a page differs (--check);
2 a bad argument, plan file or record (one line); 4 stopped by --max-commands, or a run stopped where it
resumes: run it again to continue.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vit.failures import exit_on_failure

parser = argparse.ArgumentParser(prog="vit-figures", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--plan", action="append",
                    help="a plan of experiments/ (by name) or a plan file (default: gpu with CUDA, else cpu; "
                         "--quick: every plan of experiments/); may be given several times")
parser.add_argument("--data-root", type=Path, default=Path("data"),
                    help="the folder holding cifar-10-batches-py/ and FashionMNIST/ (each downloaded there when "
                         "missing; Fashion-MNIST becomes image folders in fashion-mnist-folders/ there)")
parser.add_argument("--runs", type=Path, default=Path("runs/figures"), help="where the runs' folders go")
parser.add_argument("--results", type=Path, default=None, help="the records' folder (default: results/ of the repository)")
parser.add_argument("--readme", type=Path, default=None,
                    help="the one page to render (default: the repository's README.md and docs/*.md)")
parser.add_argument("--minutes", type=float, default=None,
                    help="end each command it runs within this many minutes, continuing a longer run in the next "
                         "command (default: each run whole)")
parser.add_argument("--total-minutes", type=float, default=None,
                    help="end the plan within this many minutes, start to last record: a row that would not fit in "
                         "what is left is skipped, pending (default: the plan's budget_minutes; none without it)")
parser.add_argument("--scale", type=float, default=1.0,
                    help="every budget (each row's and the total) times this: a rehearsal of a plan in a fraction "
                         "of its time, e.g. the gpu plan on a CPU (default 1)")
parser.add_argument("--max-commands", type=int, default=None, help="stop after this many commands (exit 4)")
parser.add_argument("--quick", action="store_true",
                    help="toy scale on CPU, on generated data; records, data and runs under --results")
parser.add_argument("--render", action="store_true", help="measure nothing: render README and docs/ from the records")
parser.add_argument("--check", action="store_true", help="measure nothing: exit 1 if a page differs from its rendering")


def default_plan() -> str:
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


def quick_dirs(results_dir: Path) -> tuple[Path, Path]:
    """--quick's data and runs, beside its records (so that the same command continues a stopped run)."""
    from vit.plans import make_quick_data

    quick = results_dir / ".quick"
    return make_quick_data(quick / "data"), quick / "runs"  # (the same files each time: rng seed 0)


@exit_on_failure
def main(argv: list[str] | None = None) -> int:
    from vit import plans as plans_
    from vit.reporting import tables
    from vit.exits import ConfigError

    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    for option, value in (("--minutes", args.minutes), ("--total-minutes", args.total_minutes), ("--scale", args.scale)):
        if value is not None and not 0 < value < float("inf"):
            print(f"error: {option} {value:g}: takes a positive number", file=sys.stderr)
            return 2
    results_dir = (args.results or plans_.REPO / "results").resolve()
    if args.scale != 1 and args.results is None:
        print("error: --scale needs --results DIR (a rehearsal's records never go into the repository's results/)",
              file=sys.stderr)
        return 2
    if args.quick and args.results is None:
        print("error: --quick needs --results DIR (toy records never go into the repository's results/)",
              file=sys.stderr)
        return 2
    every = plans_.load_all()
    if args.plan:
        chosen = [plans_.load(plans_.find(p)) for p in args.plan]
    else:
        chosen = [p for p in every if not p.history] if args.quick else [plans_.load(plans_.find(default_plan()))]
    from vit.commands.train import ArgumentCheck

    measure = not (args.render or args.check)
    data, runs = quick_dirs(results_dir) if args.quick and measure else (args.data_root.resolve(), args.runs.resolve())
    runner = plans_.Runner(data, runs, results_dir, minutes=args.minutes, quick=args.quick,
                           max_commands=args.max_commands, check_command=ArgumentCheck(),
                           total_minutes=args.total_minutes, scale=args.scale)
    if measure:
        for plan in chosen:
            if plan.history:
                raise ConfigError(f"{plan.path}: history: a plan kept for its records; it does not run")
            if not runner.run_plan(plan):
                print(f"[figures] stopped after {runner.commands} command(s) (--max-commands): run the same "
                      f"command again to continue", file=sys.stderr)
                return plans_.STOPPED
    pages = [args.readme] if args.readme else tables.pages()
    stale = []
    for page in pages:
        text = page.read_text()
        try:
            rendered = tables.render(text, results_dir, page.resolve().parent, every, runner=runner)
        except ConfigError as e:
            raise ConfigError(f"{page}: {e}") from None
        if rendered != text:
            stale.append(page)
            if not args.check:
                page.write_text(rendered)
                print(f"[figures] rendered {page} from {results_dir}")
    if args.check and stale:
        print(f"error: the tables of {', '.join(map(str, stale))} differ from the records in {results_dir}: "
              f"run `make figures ARGS=--render`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
