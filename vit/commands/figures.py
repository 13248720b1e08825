"""`vit-figures` / `python scripts/figures.py` (`make figures`): measure the figures of README and docs/ on
this machine, keep their records in results/, and render the pages' tables from them.

    make figures                                    this machine's plan (cpu, or gpu where CUDA is), then the pages
    make figures ARGS="--plan muon-horizon"         AdamW against Muon at 10 and 30 minutes (on CPUs)
    make figures ARGS="--plan cpu-levers"           the cpu recipe against sincos E_pos, linear decay, flip TTA
    make figures ARGS="--plan cpu-shape"            the cpu recipe against five changes of its own choices
    make figures ARGS="--plan cpu-mimetic"          mimetic initialisation at two scales, with Muon and AdamW
    make figures ARGS="--plan cpu-regularisation"   no weight decay, an EMA, the warmup's length
    make figures ARGS="--plan cpu-round2"           the cpu recipe against its version before float32 Newton–Schulz
    make figures ARGS="--plan cpu-choices"          its shape, augmentation and resize stages, one change each
    make figures ARGS="--plan fashion-mnist"        the same two versions on Fashion-MNIST folders
    make figures ARGS="--plan fashion-workers"      the cpu recipe on those folders with 0 and 2 data workers
    make figures ARGS="--quick"                     every step of every plan at toy scale on CPU (a test runs it)
    make figures ARGS="--render"                    only re-render README and docs/ from results/
    make figures ARGS="--check"                     exit 1 if their tables differ from results/

A row that has a record in results/ is not measured again, and a run whose folder exists (runs/figures/
TABLE/ROW) is resumed: to measure a table again, delete both (rm -r results/cpu runs/figures/cpu).

Each training run and each benchmark runs whole, as one command. With --minutes M (where a job's time
is bounded), each command it runs ends within M minutes instead: a longer training
run stops at an epoch end with exit 4 and the next command continues it exactly (--ckpt_path last); a
benchmark stops with the sections it has not finished, which the next command measures (vit-benchmark
--minutes). With --max-commands N it stops after N commands (exit 4); the same make figures continues
where it stopped.

Exit status: 0 done; 1 a step failed (its own output says why) or a page differs (--check);
2 a bad argument; 4 stopped by --max-commands: run it again to continue.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vit.figures import PLANS

parser = argparse.ArgumentParser(prog="vit-figures", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--plan", action="append",
                    help=f"one of {', '.join(PLANS)} (default: gpu with CUDA, else cpu; --quick: all); may be given "
                         "several times")
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
parser.add_argument("--max-commands", type=int, default=None, help="stop after this many commands (exit 4)")
parser.add_argument("--quick", action="store_true",
                    help="toy scale on CPU, on generated data; records, data and runs under --results")
parser.add_argument("--render", action="store_true", help="measure nothing: render README and docs/ from the records")
parser.add_argument("--check", action="store_true", help="measure nothing: exit 1 if a page differs from its rendering")


def main(argv: list[str] | None = None) -> int:
    from vit import figures

    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    plans = args.plan or (list(figures.PLANS) if args.quick else [figures.default_plan()])
    unknown = [p for p in plans if p not in figures.PLANS]
    if unknown:
        print(f"error: --plan {unknown[0]}: not a plan ({', '.join(figures.PLANS)})", file=sys.stderr)
        return 2
    if args.minutes is not None and args.minutes <= 0:
        print(f"error: --minutes {args.minutes:g}: takes a positive number of minutes", file=sys.stderr)
        return 2
    results_dir = args.results or figures.REPO / "results"
    if args.quick and args.results is None:
        print("error: --quick needs --results DIR (toy records never go into the repository's results/)",
              file=sys.stderr)
        return 2
    if not (args.render or args.check):
        data, runs = (figures.quick_dirs(results_dir.resolve()) if args.quick else
                      (args.data_root.resolve(), args.runs.resolve()))
        runner = figures.Runner(data, runs, results_dir.resolve(), minutes=args.minutes, quick=args.quick,
                                max_commands=args.max_commands)
        try:
            done = figures.measure(plans, runner)
        except figures.FiguresError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        if not done:
            print(f"[figures] stopped after {runner.commands} command(s) (--max-commands): run the same command "
                  f"again to continue", file=sys.stderr)
            return 4
    pages = [args.readme] if args.readme else figures.pages()
    stale = []
    for page in pages:
        text = page.read_text()
        rendered = figures.render(text, results_dir.resolve(), page.resolve().parent)
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
