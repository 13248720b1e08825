"""Plans: a grid of training runs (and benchmarks) written as a YAML file, run on this machine or as one
SLURM job array, their records kept per run (``vit-plan``; README's figures are the plans in the
repository's experiments/ folder, ``make figures``).

A plan file::

    # what the plan measures (a comment)
    table: my-sweep            # its runs' folder and table (default: the file's name)
    args: [--config, cpu]      # the recipe every run starts from: vit-train's arguments
    seeds: [0, 1]              # each run once per seed: NAME-sSEED, --seed_everything SEED (none: one run each,
                               # the recipe's seed)
    minutes: 10                # each run's budget, its whole command's: it trains for --trainer.max_time of that
                               # less a reserve for start-up, compile and test, and is killed at its end
                               # (none: the recipe's max_time, no bound)
    budget_minutes: 30         # the whole plan's: a run that would not fit in what is left is skipped, pending
    resources:                 # what one run gets
      cpus: 2                  # CPU cores (a SLURM task's --cpus-per-task; default 1)
      gpus: 0                  # GPUs (--gres=gpu:N; default 0)
      memory: 8G               # --mem (default: the cluster's)
      time: "00:30:00"         # a SLURM task's time limit (--time; default: the cluster's)
      at_once: 1               # on one machine, this many runs at once, one CPU core and one thread each
    runs:                      # the changes, in the table's order
      - name: base
        label: the recipe
      - name: wd0
        label: + no weight decay
        args: [--model.optimizer.weight_decay, 0]

A benchmark may give ``minutes`` too (vit-benchmark --minutes, less the same reserve). A run may also give its own ``seeds``, ``minutes``, ``data`` (``cifar``, or ``fashion-mnist``: Fashion-MNIST
written as image folders under the data root), ``commit`` (run that commit of this repository, from a
clone of its own: its code and recipes), or be a benchmark: ``benchmark: [vit-benchmark arguments]``
instead of ``args``, its report the record of the table ``benchmark-TABLE``. ``history: true`` keeps a
plan for its records only (its runs need options this version no longer has): it renders, it does not run.

A run whose args name no recipe trains the one its plan gives it, written into its command (``--config NAME``,
as ``show`` prints it): the default recipe (vit_cifar10) where ``resources.gpus`` gives each run a GPU, else the
cpu recipe; the same on every machine that shows, renders, submits or runs the plan.

A name is one row of the table: entries may share one only to add seeds to the same change (the same label,
args, minutes, data), and no run comes twice.

What the plan sets for a run comes after all of its args, so that no recipe file in them (with its own
seed_everything, max_time or data) overrides it: its seed and budget (where the plan gives them), its data
module and root (``data``: vit.data.CIFAR10DataModule, or vit.data.ImageFolderDataModule for fashion-mnist),
its run folder; written in ``args``, these options are refused. ``vit-plan show`` prints each run's command
exactly as it runs.

Each run trains in ``RUNS/TABLE/NAME/`` (``vit-train --run NAME --ckpt_path last``: a run that stopped
continues), and its record is that folder's ``results.json``, which keeps the run's effective configuration;
every run of a plan is one W&B group, named after the table (WANDB_RUN_GROUP, which wandb reads). A run whose
record is of another configuration (the plan was edited since), or keeps none, is not done: ``run`` and ``submit`` move its
folder aside to ``RUNS/TABLE/NAME.replaced-N/``, saying what differs, and run it again; ``table`` leaves its
record out and says so. A run of another commit and a benchmark are compared by their command (the options it
sets, without what only places or bounds it). A record without them is not its run's. A run stopped by its
budget says so in its record (``"budget": {"minutes", "stopped_by_budget"}``) and its table.
"""

from vit.plans.inputs import make_quick_data
from vit.plans.plan_file import (DATA, EXPERIMENTS, NAME, PLAN_KEYS, REPO, RESOURCE_KEYS, RUN_KEYS, STOPPED, Benchmark,
                                 Plan, PlanFailed, PlanStopped, Run, find, load, load_all, max_time)
from vit.plans.run_here import PLACING, QUICK_BENCH, QUICK_TRAIN, RENAMED_SECTIONS, Runner, program
from vit.plans.slurm import sbatch_script

__all__ = ["DATA", "EXPERIMENTS", "NAME", "PLAN_KEYS", "REPO", "RESOURCE_KEYS", "RUN_KEYS", "STOPPED", "Benchmark", "Plan",
           "PlanFailed", "PlanStopped", "Run", "find", "load", "load_all", "max_time", "make_quick_data", "QUICK_BENCH",
           "QUICK_TRAIN", "PLACING", "RENAMED_SECTIONS", "Runner", "program", "sbatch_script"]
