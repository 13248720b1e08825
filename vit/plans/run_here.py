"""Running a plan's runs on this machine (``vit-plan run``, ``vit-figures``): one command each, a few at once
when the plan asks, each run's record copied into the results folder."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vit.training import results
from vit.exits import ConfigError
from vit.plans.inputs import Inputs
from vit.plans.plan_file import (DATA, REPO, RESERVE_SHARE, STOPPED, Benchmark, Plan, PlanFailed,
                                 PlanStopped, Run)

QUICK_TRAIN = ("--model.arch.dim", "16", "--model.arch.depth", "1", "--model.arch.heads", "2",
               "--model.compile", "false", "--trainer.accelerator", "cpu", "--trainer.precision", "32-true",
               "--trainer.max_epochs", "2", "--trainer.max_time", "null", "--data.batch_size", "50",
               "--data.val_size", "100", "--data.num_workers", "0", "--data.auto_augment", "null")
QUICK_BENCH = ("--quick", "--device", "cpu", "--sections", "model,step")  # (test_benchmark runs every section)


NO_FIGURES = "no_figures"  # a record the runner wrote for a job its budget killed before it wrote its own
STARTED = "plan.json"  # in a run's folder: the configuration (or command) the plan started it with
# what the runner gives a command only to place its files or bound that one command: not part of what it runs
PLACING = {"--data.root", "--trainer.default_root_dir", "--run", "--ckpt_path", "--stop_after_minutes", "--output",
           "--minutes"}
# benchmark sections renamed since some records were written: (name in the record, name today); the tables
# read the old key and show the command a user types today, and a plan compares a record's command under today's
RENAMED_SECTIONS = {"levers": "fast-paths"}


def settings(words: list[str], training: bool) -> dict[str, str]:
    """What a command line sets, to compare two commands of one run: each option's last value (a flag: "(set)"),
    its --config values in order, its other words in order; without the program's words before its first option
    and what only places or bounds the command (PLACING). A training command that names no data module trains the
    default recipe's, CIFAR-10; a benchmark's sections are named as today (RENAMED_SECTIONS)."""
    out: dict[str, str] = {}
    recipes, others = [], []
    i = next((i for i, word in enumerate(words) if word.startswith("-")), len(words))
    while i < len(words):
        option, equals, value = words[i].partition("=")
        i += 1
        if not option.startswith("-"):
            others.append(words[i - 1])
            continue
        if not equals and i < len(words) and not words[i].startswith("--"):
            value, i = words[i], i + 1
        elif not equals:
            value = "(set)"
        option = {"-c": "--config", "--data.class_path": "--data"}.get(option, option) if training else option
        if option == "--sections" and not training:
            value = ",".join(RENAMED_SECTIONS.get(name, name) for name in value.split(","))
        if option == "--config":
            recipes.append(value)
        elif option not in PLACING:
            out[option] = value
    if training:
        out.setdefault("--data", DATA["cifar"])
    return {**out, **({"--config": ", ".join(recipes)} if recipes else {}),
            **({"(arguments)": " ".join(others)} if others else {})}


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
    total_minutes: float | None = None  # the plan's wall budget, start to last record (None: the plan's
    # budget_minutes, else none); each run's own budget (its minutes) bounds its command, killed past it
    scale: float = 1.0  # every budget times this (a rehearsal of a plan at a fraction of its time)
    deadline: float | None = None  # time.monotonic() when the plan's wall budget ends

    def record_path(self, job: Run | Benchmark) -> Path:
        if self.results_dir is not None:
            return self.results_dir / job.table / f"{job.name}.json"
        return self.own_record(job)

    def own_record(self, job: Run | Benchmark) -> Path:
        if isinstance(job, Benchmark):
            return self.runs_root / job.table / f"{job.name}.json"
        return self.runs_root / job.table / job.name / results.FILE

    def recipe(self, job: Run) -> str | None:
        """The recipe of a run whose args name none, from the plan alone, so that a plan means the same on every
        machine that shows, renders, submits or runs it: the default recipe (a GPU recipe) where the plan gives
        its runs GPUs (resources.gpus), else the cpu recipe. None for a run that names its recipe, or of another
        commit (that commit's vit-train picks, by its own defaults)."""
        from vit import configs

        if job.commit or configs.named_recipes(list(job.args)):
            return None
        return configs.DEFAULT if job.gpus else configs.CPU

    def train_args(self, job: Run) -> list[str]:
        """The run's vit-train arguments (``vit-plan show`` prints them): its recipe where its args name none
        (``recipe``), the plan's and the run's args, then what the plan sets itself (its seed, budget and data
        module, ``Run.owned``; its data root and run folder), so that no recipe file or argument before them
        overrides them."""
        root = self.data_root if job.data == "cifar" else self.folders_path()
        recipe = self.recipe(job)
        return [*(("--config", recipe) if recipe else ()), *job.args, *job.owned(self.scale), "--data.root", str(root),
                "--trainer.default_root_dir", str(self.runs_root / job.table), "--run", job.name, "--ckpt_path", "last",
                *self.bound("--stop_after_minutes"), *(QUICK_TRAIN if self.quick else ())]

    def train_command(self, job: Run) -> list[str]:
        """The run's command, what it needs made first (its data's folders, its commit's checkout)."""
        if job.data == "fashion-mnist":
            self.folders()
        return [*program(self.tree(job), "train"), *self.train_args(job)]

    def configuration(self, job: Run) -> dict | None:
        """The run's effective configuration, as vit-train parses its command here (None for a run of another
        commit, whose options are that commit's); a bad or old option raises ConfigError with the parser's line."""
        if job.commit:
            return None
        if job.name not in self.planned:
            if self.check_command is None:
                raise TypeError("Runner(check_command=vit.commands.train.ArgumentCheck()) parses the runs' commands")
            self.planned[job.name] = self.check_command(self.train_args(job), False)
        return self.planned[job.name]

    def compare(self, job: Run | Benchmark, record: dict) -> list[str]:
        """How ``record`` (the job's record, or what the plan started it with: ``STARTED``) differs from what the
        plan runs as the job now ([]: it is the job's run, the one rule by which a record satisfies its row). A
        training run of this code is compared by its effective configuration; a run of another commit (whose
        options are that commit's) and a benchmark by their command's settings (``settings``). A record without
        them (one from before records kept them) differs by that: its row is pending, and runs again; so does the
        record of a job its budget killed before it wrote one of its own (``budget_record``: no figures)."""
        if record.get(NO_FIGURES):
            return ["figures: none (its budget ended it before it wrote its record)"]
        if isinstance(job, Run) and not job.commit:
            return results.differences(record, self.configuration(job))
        command = record.get("command")
        try:
            recorded = shlex.split(command) if isinstance(command, str) else None
        except ValueError:  # (a quote left open: not a command this project wrote)
            recorded = None
        if recorded is None:
            return ["command: not recorded"]
        training = isinstance(job, Run)
        return results.changes(settings(recorded, training), settings(self.command_args(job), training))

    def command_args(self, job: Run | Benchmark) -> list[str]:
        """The arguments of the job's command (vit-train's or vit-benchmark's) as this runner gives them."""
        return self.train_args(job) if isinstance(job, Run) else list(QUICK_BENCH if self.quick else job.args)

    def differences(self, job: Run | Benchmark, path: Path | None = None) -> list[str] | None:
        """How the job's record (or the record at ``path``) differs from what the plan has now (``compare``); None
        without a record."""
        path = path or self.record_path(job)
        return self.compare(job, results.read(path)) if path.is_file() else None

    def started_differences(self, job: Run | Benchmark) -> list[str] | None:
        """How what the plan started a run with (``STARTED`` in its folder, written as it starts) differs from the
        run the plan has now; None when it has no such file (or is a benchmark)."""
        path = self.runs_root / job.table / job.name / STARTED
        if not isinstance(job, Run) or not path.is_file():
            return None
        return self.compare(job, results.read(path))

    def remember(self, job: Run | Benchmark) -> None:
        """Write, in the run's folder, what the plan starts it with (``started_differences`` reads it): its
        configuration, or for a run of another commit its command."""
        if isinstance(job, Run) and not self.dry_run:
            folder = self.runs_root / job.table / job.name
            folder.mkdir(parents=True, exist_ok=True)
            part = folder / f".{STARTED}.part"  # whole or not at all
            started = {"command": shlex.join(self.train_args(job))} if job.commit else \
                {"configuration": self.configuration(job)}
            part.write_text(json.dumps(started, indent=2) + "\n")
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
                from vit.cluster import run_lock

                if (holder := run_lock.holder(folder)) is not None:
                    raise PlanFailed(f"{job.table}/{job.name} still trains under another command than the plan's now "
                                     f"({'; '.join(started[:3])}), in {folder} ({run_lock.describe(holder)}): let "
                                     f"it end or cancel it, then run the plan again")
            kept = own if isinstance(job, Benchmark) else folder  # (a benchmark's is its report, no run folder)
            targets = ([record, record.with_suffix(".diff")] if copied and record != own else []) + \
                ([kept] if copied or mine or started else [])
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

    def budget(self, job: Run | Benchmark) -> float | None:
        """The job's budget in minutes (its ``minutes`` times ``scale``), None where it has none."""
        return None if job.minutes is None else job.minutes * self.scale

    def fits(self, job: Run | Benchmark) -> bool:
        """Whether the job's budget (start-up to record: it is killed at its end) fits in what is left of the
        plan's; one line where it does not: it is skipped, and stays pending."""
        if self.deadline is None:
            return True
        left = (self.deadline - time.monotonic()) / 60
        needs = self.budget(job) or 0.0  # (a job without a budget of its own: the plan's deadline bounds it)
        if needs <= left:
            return True
        print(f"[plan] {job.name}: skipped: needs {needs:.2g} min, {max(left, 0):.2g} left", flush=True)
        return False

    def run_plan(self, plan: Plan, index: int | None = None) -> bool:
        """Run the plan's runs (or only its run ``index``, alone) to their end (False: stopped by
        max_commands; run again to continue), within the plan's wall budget when it has one (``total_minutes``,
        else its budget_minutes: a run that would not fit in what is left is skipped)."""
        total = self.total_minutes if self.total_minutes is not None else plan.budget_minutes
        self.deadline = None if total is None else time.monotonic() + 60 * total * self.scale
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
        todo = [job for job in todo if self.fits(job)]
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
                elif code is None:  # killed at its budget: its record, or one saying so
                    self.collect(self.own_record(job), job, killed=True)
                    todo.remove(job)
                elif code != STOPPED:
                    raise PlanFailed(f"{job.table}/{job.name}: vit-train exited {code} (its output is above)")
                elif self.minutes is None:  # not a command bound of ours: a signal or a time limit stopped it
                    raise PlanStopped(f"{job.table}/{job.name}: vit-train stopped where it resumes (exit 4, its "
                                      "output says why): the same command continues it")
        return True

    def compile_cache(self) -> Path:
        """Where the plan's jobs keep torch.compile's kernels (TORCHINDUCTOR_CACHE_DIR), shared by its rows: a job
        killed at its budget may leave a kernel half written, which would fail every later compile that loads
        it, so a kill empties this folder (``wait``), and the user's own cache is never the plan's."""
        return self.runs_root / ".compile-cache"

    def environment(self, pinned: bool) -> dict[str, str]:
        env = {**os.environ, **({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"} if pinned else {}),
               "TORCHINDUCTOR_CACHE_DIR": str(self.compile_cache())}
        if self.group:
            env["WANDB_RUN_GROUP"] = self.group  # wandb.init reads it: the plan's runs are one W&B group
        return env

    def wait(self, procs: list[tuple[Run | Benchmark, subprocess.Popen]]) -> list[int | None]:
        """Each process's exit status; None for one killed (its process group) at the end of its budget
        or at the plan's deadline, with one line."""
        codes = []
        for job, proc in procs:
            ends = [t for t in (self.deadline, None if self.budget(job) is None else
                                proc.started + 60 * self.budget(job)) if t is not None]
            try:
                codes.append(proc.wait(timeout=max(0.0, min(ends) - time.monotonic()) if ends else None))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                shutil.rmtree(self.compile_cache(), ignore_errors=True)  # (a kernel may be half written)
                budget = f"its {self.budget(job):g}-min budget" if self.budget(job) is not None else "the plan's budget"
                print(f"[plan] {job.name}: killed at {budget}", flush=True)
                codes.append(None)
        return codes

    def popen(self, command: list[str], **kwargs) -> subprocess.Popen:
        """A job's process, in a session of its own (a kill at its budget ends its workers too)."""
        proc = subprocess.Popen(command, start_new_session=True, **kwargs)
        proc.started = time.monotonic()
        return proc

    def train_at_once(self, jobs: list[Run], k: int = 0) -> list[int | None]:
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
            procs.append((job, self.popen(command, env=env, preexec_fn=affinity, cwd=tree)))
        return self.wait(procs)

    def benchmark_command(self, job: Benchmark, out: Path) -> list[str]:
        bound = ("--minutes", f"{self.budget(job) * (1 - RESERVE_SHARE):.3g}") if job.minutes is not None else \
            self.bound("--minutes")
        return [*program(REPO, "benchmark"), *self.command_args(job), "--output", str(out), *bound]

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
            (code,) = self.wait([(job, self.popen(command, cwd=REPO, env=self.environment(False)))])
            cut = code == STOPPED and job.minutes is not None and out.is_file() and \
                results.read(out).get("sections_pending")
            if code is None or cut:  # its budget ended it (killed, or cut short in a section)
                self.collect(out, job, killed=True)
                return True
            if code == STOPPED:
                return False
            if code:
                raise PlanFailed(f"{job.table}/{job.name}: vit-benchmark exited {code} (its output is above)")
            if self.quick:
                self.quick_report = out
        self.collect(out, job)
        return True

    def budget_record(self, record: Path, job: Run | Benchmark, killed: bool) -> dict:
        """The job's record (``record``), with its budget where it has one: ``{"minutes", "stopped_by_budget"}``
        (killed, a benchmark cut short, a training run ended by its max_time before its max_epochs). A job killed
        before it wrote one gets one here saying so, with what made it (its configuration, or its command) and no
        figures."""
        from datetime import datetime, timezone

        from vit.training import commits

        if record.is_file():  # (a run's folder holds no record but this command's: settle moves others aside)
            r = results.read(record)
        else:
            r = {NO_FIGURES: True, "command": shlex.join([f"vit-{'benchmark' if isinstance(job, Benchmark) else 'train'}",
                                        *self.command_args(job)]), **commits.commit(),
                 "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            if isinstance(job, Run) and not job.commit:
                r["configuration"] = self.configuration(job)
        if self.budget(job) is not None or killed:
            planned = (r.get("configuration") or {}).get("trainer.max_epochs")
            stopped = killed or bool(r.get("sections_pending")) or \
                isinstance(planned, int) and isinstance(r.get("epochs"), (int, float)) and r["epochs"] < planned
            r["budget"] = {"minutes": self.budget(job), "stopped_by_budget": stopped}
        return r

    def collect(self, record: Path, job: Run | Benchmark, killed: bool = False) -> None:
        """With a results folder: the run's record copied there, with its row's label and its budget
        (``budget_record``), and the diff it names (``results.keep_diff``) beside the copy."""
        if self.budget(job) is not None or killed:
            record.parent.mkdir(parents=True, exist_ok=True)
            results.write_whole(record, json.dumps(self.budget_record(record, job, killed), indent=2) + "\n")
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
