"""Running a plan's runs on this machine (``vit-plan run``, ``vit-figures``): one command each, a few at once
when the plan asks, each run's record copied into the results folder."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vit import results
from vit.exits import ConfigError
from vit.plans.inputs import Inputs
from vit.plans.plan_file import REPO, STOPPED, Benchmark, Plan, PlanFailed, PlanStopped, Run

QUICK_TRAIN = ("--model.arch.dim", "16", "--model.arch.depth", "1", "--model.arch.heads", "2",
               "--model.compile", "false", "--trainer.accelerator", "cpu", "--trainer.precision", "32-true",
               "--trainer.max_epochs", "2", "--trainer.max_time", "null", "--data.batch_size", "50",
               "--data.val_size", "100", "--data.num_workers", "0", "--data.auto_augment", "null")
QUICK_BENCH = ("--quick", "--device", "cpu", "--sections", "model,step")  # (test_benchmark runs every section)


STARTED = "plan.json"  # in a run's folder: the configuration the plan started it with


def aside(path: Path) -> Path:
    """Move a file or folder aside, beside itself, as NAME.replaced-N (the first N free; a run's name has no
    dot, so no run takes it): kept, never deleted, and no longer the run's."""
    stem, suffix = (path.stem, path.suffix) if path.is_file() else (path.name, "")
    n = 1
    while (target := path.with_name(f"{stem}.replaced-{n}{suffix}")).exists():
        n += 1
    os.replace(path, target)
    return target


def program(tree: Path, command: str) -> list[str]:
    """How to start a command of ``tree``'s code: its scripts/COMMAND.py (a checkout), else the console script
    installed beside this Python (vit-COMMAND). A commit's checkout (a clone of this repository) has its
    scripts, made or not yet."""
    script = tree / "scripts" / f"{command}.py"
    if script.is_file() or tree != REPO:
        return [sys.executable, str(script)]
    return [str(Path(sys.executable).with_name(f"vit-{command}"))]


@dataclass
class Runner(Inputs):
    """Runs a plan's runs that have no record yet: each trains in ``runs_root/TABLE/NAME``; with
    ``results_dir``, its record is copied to ``results_dir/TABLE/NAME.json`` with its row's label (README's
    records) and a run is done when that copy exists."""

    data_root: Path
    runs_root: Path
    results_dir: Path | None = None
    minutes: float | None = None  # each command's wall-clock bound; None: each run and benchmark whole
    quick: bool = False
    max_commands: int | None = None  # stop after this many commands
    commands: int = 0
    quick_report: Path | None = None  # --quick: the one benchmark's report
    group: str | None = None  # the W&B group of the plan being run
    pin: bool = False  # the plan runs several at once (resources.at_once > 1): each run one core, one thread
    planned: dict = field(default_factory=dict)  # each run's effective configuration (``configuration``)
    # vit-train's check of a command line, its effective configuration (vit.commands.train.ArgumentCheck), given by
    # the command that runs the plan: the library imports no command
    check_command: Callable[..., dict] | None = None
    dry_run: bool = False  # commands only: checkouts and data are named where they will be, not made (Inputs)

    def record_path(self, job: Run | Benchmark) -> Path:
        if self.results_dir is not None:
            return self.results_dir / job.table / f"{job.name}.json"
        return self.own_record(job)

    def own_record(self, job: Run | Benchmark) -> Path:
        if isinstance(job, Benchmark):
            return self.runs_root / job.table / f"{job.name}.json"
        return self.runs_root / job.table / job.name / results.FILE

    def train_args(self, job: Run) -> list[str]:
        """The run's vit-train arguments (``vit-plan show`` prints them): the plan's and the run's args, then what
        the plan sets itself (its seed, budget and data module, ``Run.owned``; its data root and run folder), so
        that no recipe file or argument before them overrides them."""
        root = self.data_root if job.data == "cifar" else self.folders_path()
        return [*job.args, *job.owned(), "--data.root", str(root), "--trainer.default_root_dir",
                str(self.runs_root / job.table), "--run", job.name, "--ckpt_path", "last",
                *self.bound("--stop_after_minutes"), *(QUICK_TRAIN if self.quick else ())]

    def train_command(self, job: Run) -> list[str]:
        """The run's command, what it needs made first (its data's folders, its commit's checkout)."""
        if job.data == "fashion-mnist":
            self.folders()
        return [*program(self.tree(job), "train"), *self.train_args(job)]

    def configuration(self, job: Run, note: bool = False) -> dict | None:
        """The run's effective configuration, as vit-train parses its command here (None for a run of another
        commit, whose options are that commit's); a bad or old option raises ConfigError with the parser's line."""
        if job.commit:
            return None
        if job.name not in self.planned:
            if self.check_command is None:
                raise TypeError("Runner(check_command=vit.commands.train.ArgumentCheck()) parses the runs' commands")
            self.planned[job.name] = self.check_command(self.train_args(job), note)
        return self.planned[job.name]

    def differences(self, job: Run | Benchmark, path: Path | None = None) -> list[str] | None:
        """How the job's record (or the record at ``path``) differs from the run the plan has now ([]: it is that
        run; None: no record, or one that cannot tell: from before records kept their configuration, or of another
        commit's run)."""
        path = path or self.record_path(job)
        if not isinstance(job, Run) or not path.is_file():
            return None
        record = results.read(path)
        return results.differences(record, self.configuration(job)) if "configuration" in record else None

    def started_differences(self, job: Run | Benchmark) -> list[str] | None:
        """How the command the plan started a run with (``STARTED`` in its folder, written as it starts) differs from
        the run the plan has now; None when it has no such file (or is not a training run of this code)."""
        path = self.runs_root / job.table / job.name / STARTED
        if not isinstance(job, Run) or job.commit or not path.is_file():
            return None
        return results.differences(results.read(path), self.configuration(job))

    def remember(self, job: Run | Benchmark) -> None:
        """Write, in the run's folder, the configuration the plan starts it with (``started_differences`` reads it)."""
        if isinstance(job, Run) and not job.commit and not self.dry_run:
            folder = self.runs_root / job.table / job.name
            folder.mkdir(parents=True, exist_ok=True)
            part = folder / f".{STARTED}.part"  # whole or not at all
            part.write_text(json.dumps({"configuration": self.configuration(job)}, indent=2) + "\n")
            os.replace(part, folder / STARTED)

    def settle(self, jobs: list[Run | Benchmark]) -> int:
        """Before running ``jobs``: a run whose record is another command's (the plan changed since) is moved
        aside, record and run folder, never deleted, with one line naming what differs, and runs again. Says how
        many of ``jobs`` have their records (those are skipped); returns that number."""
        for job in jobs:
            record, own, folder = self.record_path(job), self.own_record(job), self.runs_root / job.table / job.name
            copied = self.differences(job)  # (with a results folder: its copy there; else the run's own)
            mine = self.differences(job, own) if own != record else copied
            started = self.started_differences(job) if copied is None and mine is None else None
            if started:  # no record yet: a run the plan started under another command, its checkpoints that run's
                from vit import run_lock

                if (holder := run_lock.holder(folder)) is not None:
                    raise PlanFailed(f"{job.table}/{job.name} still trains under another command than the plan's now "
                                     f"({'; '.join(started[:3])}), in {folder} ({run_lock.describe(holder)}): let "
                                     f"it end or cancel it, then run the plan again")
            targets = ([record, record.with_suffix(".diff")] if copied and record != own else []) + \
                ([folder] if copied or mine or started else [])
            if targets:
                differ = copied or mine or started
                moved = [aside(p) for p in targets if p.exists()]
                what = "its record is of" if copied or mine else "it was started under"
                print(f"[plan] {job.table}/{job.name}: {what} another command ({'; '.join(differ[:3])}"
                      f"{f'; {len(differ) - 3} more' if len(differ) > 3 else ''}): moved aside to "
                      f"{', '.join(map(str, moved))}; it runs again", flush=True)
        done = sum(self.record_path(job).is_file() for job in jobs)
        if done:
            print(f"[plan] {done} of {len(jobs)} runs have their records: "
                  + ("nothing to run" if done == len(jobs) else "those are skipped"), flush=True)
        return done

    def bound(self, option: str) -> tuple[str, ...]:
        """``option minutes`` for a command when a bound was asked for (--minutes), else nothing."""
        return (option, f"{self.minutes:g}") if self.minutes is not None else ()

    def run_plan(self, plan: Plan, index: int | None = None) -> bool:
        """Run the plan's runs (or only its run ``index``, alone) to their end (False: stopped by
        max_commands; run again to continue)."""
        self.group = plan.table
        self.check(plan)
        self.cifar(plan)
        self.pin = index is None and plan.resources["at_once"] > 1
        groups = [[plan.runs[index]]] if index is not None else plan.groups()
        self.settle([job for group in groups for job in group])
        for k, group in enumerate(groups):
            if not self.run_group(group, k):
                return False
        return True

    def check(self, plan: Plan) -> None:
        """Refuse, before any work, resources this machine cannot give the plan's runs at once."""
        r = plan.resources
        if r["at_once"] > 1 and r["gpus"] > 0:
            raise ConfigError(f"{plan.path}: resources.at_once {r['at_once']} with gpus {r['gpus']}: runs at once "
                              "share this machine's CPU cores, not its GPUs; use at_once: 1")
        cores = len(os.sched_getaffinity(0))
        if r["at_once"] > cores:
            raise ConfigError(f"{plan.path}: resources.at_once {r['at_once']}: this process may use {cores} CPU "
                              f"core(s), one per run at once; use at_once: {cores} or fewer")

    def run_group(self, group: list[Run | Benchmark], k: int = 0) -> bool:
        todo = [job for job in group if not self.record_path(job).is_file()]
        while todo:
            if self.max_commands is not None and self.commands >= self.max_commands:
                return False
            self.commands += 1
            if isinstance(todo[0], Benchmark):
                if self.benchmark(todo[0]):
                    todo.pop(0)
                continue
            codes = self.train_at_once(todo, k)
            for job, code in zip(list(todo), codes):
                if code == 0:
                    self.collect(self.own_record(job), job)
                    todo.remove(job)
                elif code != STOPPED:
                    raise PlanFailed(f"{job.table}/{job.name}: vit-train exited {code} (its output is above)")
                elif self.minutes is None:  # not a command bound of ours: a signal or a time limit stopped it
                    raise PlanStopped(f"{job.table}/{job.name}: vit-train stopped where it resumes (exit 4, its "
                                      "output says why): the same command continues it")
        return True

    def environment(self, pinned: bool) -> dict[str, str]:
        env = {**os.environ, **({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"} if pinned else {})}
        if self.group:
            env["WANDB_RUN_GROUP"] = self.group  # wandb.init reads it: the plan's runs are one W&B group
        return env

    def train_at_once(self, jobs: list[Run], k: int = 0) -> list[int]:
        """Each job as one command (of at most ``minutes`` when given); the runs of a plan with several at once
        (``pin``) get one CPU core and one thread each, a group's last run alone too, the cores taken in turn by
        the plan's groups (the k-th starts at core k)."""
        pinned = self.pin or len(jobs) > 1
        cores = sorted(os.sched_getaffinity(0))
        procs = []
        for i, job in enumerate(jobs):
            core = cores[(i + k) % len(cores)]
            command = self.train_command(job)
            self.remember(job)
            print(f"[plan] {shlex.join(command[1:])}" + (f"   (core {core})" if pinned else ""), flush=True)
            env = self.environment(pinned)
            tree = self.tree(job)
            if job.commit:  # its own package first (before this checkout's installed one)
                env["PYTHONPATH"] = self.pythonpath(tree, env.get("PYTHONPATH"))
            affinity = (lambda c=core: os.sched_setaffinity(0, {c})) if pinned else None
            procs.append(subprocess.Popen(command, env=env, preexec_fn=affinity, cwd=tree))
        return [p.wait() for p in procs]

    def benchmark_command(self, job: Benchmark, out: Path) -> list[str]:
        return [*program(REPO, "benchmark"), *(QUICK_BENCH if self.quick else job.args), "--output", str(out),
                *self.bound("--minutes")]

    def benchmark(self, job: Benchmark) -> bool:
        """One command of the benchmark, bounded by ``minutes`` (when given) as a training command is (False:
        it stopped with sections left, which the next command measures)."""
        out = self.own_record(job)
        out.parent.mkdir(parents=True, exist_ok=True)
        if self.quick_report:  # --quick runs one command for every benchmark: it runs once
            print(f"[plan] {job.table}/{job.name}: the --quick benchmark's report, {self.quick_report}", flush=True)
            shutil.copyfile(self.quick_report, out)
        else:
            command = self.benchmark_command(job, out)
            print(f"[plan] {shlex.join(command[1:])}", flush=True)
            code = subprocess.run(command, cwd=REPO, env=self.environment(False)).returncode
            if code == STOPPED:
                return False
            if code:
                raise PlanFailed(f"{job.table}/{job.name}: vit-benchmark exited {code} (its output is above)")
            if self.quick:
                self.quick_report = out
        self.collect(out, job)
        return True

    def collect(self, record: Path, job: Run | Benchmark) -> None:
        """With a results folder: the run's record copied there, with its row's label, and the diff it names
        (``results.keep_diff``) beside the copy."""
        if self.results_dir is None:
            print(f"[plan] record: {record}", flush=True)
            return
        path = self.record_path(job)
        path.parent.mkdir(parents=True, exist_ok=True)
        copy = {"row": job.label, **results.read(record)}
        if "diff" in copy:
            diff = record.parent / copy.pop("diff")
            if diff.is_file():
                shutil.copyfile(diff, path.with_suffix(".diff"))
                copy["diff"] = path.with_suffix(".diff").name
        path.write_text(json.dumps(copy, indent=2) + "\n")
        print(f"[plan] record: {path}", flush=True)
