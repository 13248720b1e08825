"""Plans: a grid of training runs (and benchmarks) written as a YAML file, run on this machine or as one
SLURM job array, their records kept per run (``vit-plan``; README's figures are the plans in the
repository's experiments/ folder, ``make figures``).

A plan file::

    # what the plan measures (a comment)
    table: my-sweep            # its runs' folder and table (default: the file's name)
    args: [--config, cpu]      # the recipe every run starts from: vit-train's arguments
    seeds: [0, 1]              # each run once per seed: NAME-sSEED, --seed_everything SEED (none: one run each)
    minutes: 10                # each run's budget: --trainer.max_time (none: the recipe's)
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

A run may also give its own ``seeds``, ``minutes``, ``data`` (``cifar``, or ``fashion-mnist``: Fashion-MNIST
written as image folders under the data root), ``commit`` (run that commit of this repository, from a
clone of its own: its code and recipes), or be a benchmark: ``benchmark: [vit-benchmark arguments]``
instead of ``args``, its report the record of the table ``benchmark-TABLE``. ``history: true`` keeps a
plan for its records only (its runs need options this version no longer has): it renders, it does not run.

Each run trains in ``RUNS/TABLE/NAME/`` (``vit-train --run NAME --ckpt_path last``: a run that stopped
continues), and its record is that folder's ``results.json``; every run of a plan is one W&B group, named
after the table (WANDB_RUN_GROUP, which wandb reads).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from vit import results
from vit.exits import ConfigError, RunFailed, Stopped, status_of
from vit.launch import array_script

REPO = results.REPO
EXPERIMENTS = REPO / "experiments"  # the plans of README's and docs/' tables (a checkout's, not the package's)
STOPPED = status_of(Stopped())  # vit-train's exit status for a run that stopped where it resumes (4)
NAME = re.compile(r"[A-Za-z0-9][\w-]*")
PLAN_KEYS = {"table", "args", "seeds", "minutes", "resources", "runs", "history"}
RUN_KEYS = {"name", "label", "args", "seeds", "minutes", "data", "commit", "benchmark"}
RESOURCE_KEYS = {"cpus": 1, "gpus": 0, "memory": None, "time": None, "at_once": 1}  # None: the cluster's default
DATA = ("cifar", "fashion-mnist")


class PlanFailed(RunFailed):
    """A run of a plan failed (its own output says why) or could not start; the message says which."""


class PlanStopped(Stopped):
    """A run stopped where it resumes (vit-train's exit 4: a signal, a time limit) when no --minutes bound
    asked for it; the same command continues it."""


@dataclass(frozen=True)
class Run:
    """One training run: ``vit-train`` with ``args``, its record the row ``label`` of ``table``."""

    table: str
    name: str
    label: str
    args: tuple[str, ...]
    commit: str | None = None
    data: str = "cifar"
    change: str = ""  # the plan's run it expands (its name without the seed)
    own: tuple[str, ...] = ()  # that run's own arguments (beside the plan's)


@dataclass(frozen=True)
class Benchmark:
    """One ``vit-benchmark`` with ``args``: its report is the record of the row ``label`` of ``table``."""

    table: str
    name: str
    label: str
    args: tuple[str, ...] = ()
    change: str = ""


@dataclass(frozen=True)
class Plan:
    path: Path
    table: str
    runs: tuple[Run | Benchmark, ...]  # expanded, in the table's order
    resources: dict = field(default_factory=lambda: dict(RESOURCE_KEYS))
    history: bool = False

    @property
    def name(self) -> str:
        return self.path.stem

    def tables(self) -> set[str]:
        return {job.table for job in self.runs}

    def groups(self) -> list[list[Run | Benchmark]]:
        """What runs at once on one machine: ``at_once`` training runs in a row of the plan, a benchmark alone."""
        groups: list[list[Run | Benchmark]] = []
        for job in self.runs:
            last = groups[-1] if groups else None
            if isinstance(job, Run) and last and isinstance(last[0], Run) and len(last) < self.resources["at_once"]:
                last.append(job)
            else:
                groups.append([job])
        return groups


def _fail(path: Path, key: str, what: str) -> ConfigError:
    return ConfigError(f"{path}: {key}: {what}")


def _words(value, path: Path, key: str) -> tuple[str, ...]:
    """A list of command-line words; numbers and booleans as YAML wrote them (true, 0.5)."""
    if not isinstance(value, list):
        raise _fail(path, key, "takes a list of command-line words, e.g. [--model.optimizer.lr, 1e-3]")
    words = []
    for word in value:
        if isinstance(word, bool):
            words.append(str(word).lower())
        elif word is None:
            words.append("null")
        elif isinstance(word, (str, int, float)):
            words.append(str(word))
        else:
            raise _fail(path, key, f"{word!r} is not one word: quote it (\"[0.7, 0.4]\")")
    return tuple(words)


def _seeds(value, path: Path, key: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or not all(type(s) is int and s >= 0 for s in value) \
            or len(set(value)) != len(value):
        raise _fail(path, key, "takes a list of distinct seeds (integers from 0), e.g. [0, 1]")
    return tuple(value)


def _minutes(value, path: Path, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise _fail(path, key, "takes a positive (finite) number of minutes")
    return float(value)


def max_time(minutes: float) -> str:
    """Lightning's ``--trainer.max_time`` (DD:HH:MM:SS) for a budget of ``minutes``."""
    seconds = round(minutes * 60)
    return f"{seconds // 86400:02d}:{seconds // 3600 % 24:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _resources(value, path: Path) -> dict:
    if value is None:
        return dict(RESOURCE_KEYS)
    if not isinstance(value, dict):
        raise _fail(path, "resources", f"takes a mapping of {', '.join(RESOURCE_KEYS)}")
    for key in value:
        if key not in RESOURCE_KEYS:
            raise _fail(path, f"resources.{key}", f"not a resource (one of {', '.join(RESOURCE_KEYS)})")
    out = {**RESOURCE_KEYS, **value}
    for key in ("cpus", "at_once"):
        if type(out[key]) is not int or out[key] < 1:
            raise _fail(path, f"resources.{key}", "takes a whole number from 1")
    if type(out["gpus"]) is not int or out["gpus"] < 0:
        raise _fail(path, "resources.gpus", "takes a whole number from 0")
    if out["memory"] is not None and (not isinstance(out["memory"], str)
                                      or not re.fullmatch(r"\d+[KMGT]?", out["memory"])):
        raise _fail(path, "resources.memory", "takes an amount as SLURM writes it, e.g. 8G or 16000M")
    if out["time"] is not None and (not isinstance(out["time"], str)
                                    or not re.fullmatch(r"(\d+-)?\d+(:\d\d){0,2}", out["time"])):
        raise _fail(path, "resources.time", 'takes a time limit as SLURM writes it, e.g. "01:30:00" or "2-00:00:00"')
    return out


def load(path: Path) -> Plan:
    """Read and check a plan file; a bad one raises ConfigError naming the file and the key."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such plan file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot be read ({e})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a plan is a mapping with runs: (and table, args, seeds, minutes, resources)")
    for key in data:
        if key not in PLAN_KEYS:
            raise _fail(path, str(key), f"not a plan key (one of {', '.join(sorted(PLAN_KEYS))})")
    table = data.get("table", path.stem)
    if not isinstance(table, str) or not NAME.fullmatch(table):
        raise _fail(path, "table", "takes a name of letters, digits, '-' and '_'")
    base = _words(data.get("args", []), path, "args")
    seeds = _seeds(data["seeds"], path, "seeds") if "seeds" in data else None
    minutes = _minutes(data["minutes"], path, "minutes") if "minutes" in data else None
    resources = _resources(data.get("resources"), path)
    history = data.get("history", False)
    if not isinstance(history, bool):
        raise _fail(path, "history", "takes true or false")
    entries = data.get("runs")
    if not isinstance(entries, list) or not entries:
        raise _fail(path, "runs", "takes a list of runs, each with a name (and label, args, seeds, ...)")
    runs: list[Run | Benchmark] = []
    for i, entry in enumerate(entries):
        where = f"runs[{i}]"
        if not isinstance(entry, dict) or "name" not in entry:
            raise _fail(path, where, "takes a mapping with a name (and label, args, seeds, ...)")
        for key in entry:
            if key not in RUN_KEYS:
                raise _fail(path, f"{where}.{key}", f"not a key of a run (one of {', '.join(sorted(RUN_KEYS))})")
        name = entry["name"]
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise _fail(path, f"{where}.name", "takes a name of letters, digits, '-' and '_'")
        label = entry.get("label", name)
        if not isinstance(label, str) or "|" in label or "\n" in label:
            raise _fail(path, f"{where}.label", "takes one line of text without '|'")
        if "benchmark" in entry:
            for key in ("args", "seeds", "minutes", "data", "commit"):
                if key in entry:
                    raise _fail(path, f"{where}.{key}", "a benchmark takes only name, label and benchmark")
            runs.append(Benchmark(f"benchmark-{table}", name, label, _words(entry["benchmark"], path,
                                                                             f"{where}.benchmark"), name))
            continue
        args = _words(entry.get("args", []), path, f"{where}.args")
        run_seeds = _seeds(entry["seeds"], path, f"{where}.seeds") if "seeds" in entry else seeds
        run_minutes = _minutes(entry["minutes"], path, f"{where}.minutes") if "minutes" in entry else minutes
        data_kind = entry.get("data", "cifar")
        if data_kind not in DATA:
            raise _fail(path, f"{where}.data", f"one of {', '.join(DATA)}")
        commit = entry.get("commit")
        if commit is not None and (not isinstance(commit, str) or not re.fullmatch(r"[0-9a-f]{7,40}", commit)):
            raise _fail(path, f"{where}.commit", "takes a commit of this repository (7 to 40 hex digits)")
        budget = ("--trainer.max_time", max_time(run_minutes)) if run_minutes else ()
        for seed in run_seeds if run_seeds is not None else (None,):
            suffix = ("", "") if seed is None else (f"-s{seed}", f", seed {seed}")
            seeded = () if seed is None else ("--seed_everything", str(seed))
            runs.append(Run(table, name + suffix[0], label + suffix[1], (*base, *budget, *seeded, *args), commit,
                            data_kind, name, args))
    seen: set[tuple[str, str]] = set()
    for job in runs:
        if (job.table, job.name) in seen:
            raise _fail(path, "runs", f"the run {job.name} comes twice (give each name's entries other seeds)")
        seen.add((job.table, job.name))
    return Plan(path, table, tuple(runs), resources, history)


def find(plan: str | Path) -> Path:
    """A plan file: a path, or the name of one in the repository's experiments/ folder."""
    path = Path(plan)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    named = EXPERIMENTS / f"{plan}.yaml"
    if named.is_file():
        return named
    names = ", ".join(p.stem for p in sorted(EXPERIMENTS.glob("*.yaml")))
    raise ConfigError(f"{plan}: neither a plan file nor a plan of {EXPERIMENTS}" + (f" ({names})" if names else ""))


def load_all(folder: Path = EXPERIMENTS) -> list[Plan]:
    """Every plan of a folder (README's and docs/' tables: the repository's experiments/)."""
    plans = [load(p) for p in sorted(Path(folder).glob("*.yaml"))]
    owner: dict[str, Path] = {}
    for plan in plans:
        for table in plan.tables():
            if table in owner:
                raise ConfigError(f"{plan.path}: table: {table} is also {owner[table]}'s")
            owner[table] = plan.path
    return plans


# --- running -----------------------------------------------------------------------------------------------
QUICK_TRAIN = ("--model.arch.dim", "16", "--model.arch.depth", "1", "--model.arch.heads", "2",
               "--model.compile", "false", "--trainer.accelerator", "cpu", "--trainer.precision", "32-true",
               "--trainer.max_epochs", "2", "--trainer.max_time", "null", "--data.batch_size", "50",
               "--data.val_size", "100", "--data.num_workers", "0", "--data.auto_augment", "null")
QUICK_BENCH = ("--quick", "--device", "cpu", "--sections", "model,step")  # (test_benchmark runs every section)


def program(tree: Path, command: str) -> list[str]:
    """How to start a command of ``tree``'s code: its scripts/COMMAND.py (a checkout), else the console script
    installed beside this Python (vit-COMMAND)."""
    script = tree / "scripts" / f"{command}.py"
    if script.is_file():
        return [sys.executable, str(script)]
    return [str(Path(sys.executable).with_name(f"vit-{command}"))]


@dataclass
class Runner:
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

    def record_path(self, job: Run | Benchmark) -> Path:
        if self.results_dir is not None:
            return self.results_dir / job.table / f"{job.name}.json"
        return self.own_record(job)

    def own_record(self, job: Run | Benchmark) -> Path:
        if isinstance(job, Benchmark):
            return self.runs_root / job.table / f"{job.name}.json"
        return self.runs_root / job.table / job.name / results.FILE

    def tree(self, job: Run) -> Path:
        """Where the job's code is: this checkout, or a clone of the job's commit under RUNS/.checkouts (made in a
        sibling folder and moved into place when complete: a clone that was cut short is never used)."""
        if job.commit is None:
            return REPO
        tree = self.runs_root / ".checkouts" / job.commit[:7]
        if not tree.is_dir():
            if subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{job.commit}^{{commit}}"]).returncode:
                raise PlanFailed(f"{job.table}/{job.name} runs commit {job.commit}, which this clone does not have "
                                 "(a shallow clone? `git fetch --unshallow` brings it)")
            tree.parent.mkdir(parents=True, exist_ok=True)
            part = tree.with_name(f"{tree.name}.part-{os.getpid()}")
            shutil.rmtree(part, ignore_errors=True)
            for command in (["git", "clone", "--quiet", "--shared", "--no-checkout", str(REPO), str(part)],
                            ["git", "-C", str(part), "checkout", "--quiet", "--detach", job.commit]):
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode:
                    shutil.rmtree(part, ignore_errors=True)
                    why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
                    raise PlanFailed(f"{job.table}/{job.name}: could not check out commit {job.commit} into {tree} "
                                     f"({shlex.join(command[:4])}: {why})")
            # its recipes as its package (pyproject's package-dir maps configs/ to vit.configs), so that
            # PYTHONPATH=tree imports its vit and its recipes, never this checkout's (an untracked link)
            link = part / "vit" / "configs"
            if not link.exists() and not link.is_symlink():
                link.symlink_to(Path("..") / "configs")
            try:
                os.replace(part, tree)
            except OSError:  # another process put the same checkout in place first
                shutil.rmtree(part, ignore_errors=True)
                if not tree.is_dir():
                    raise
        return tree

    @staticmethod
    def pythonpath(tree: Path, rest: str | None = None, shell: bool = False) -> str:
        """PYTHONPATH for a commit's run: its own checkout first (before this checkout's installed package),
        then ``rest``; ``shell``: a bash word that appends the script's own $PYTHONPATH when set."""
        if shell:
            return shlex.quote(str(tree)) + "${PYTHONPATH:+:$PYTHONPATH}"
        return os.pathsep.join(filter(None, [str(tree), rest]))

    def cifar(self, plan: Plan) -> None:
        """CIFAR-10 in the data root before any run starts (runs at once, or a job array's tasks, would each
        fetch it into one folder): downloaded once here when missing; --quick: generated."""
        from vit import cifar
        from vit.exits import DatasetError

        if not any(isinstance(job, Run) and job.data == "cifar" for job in plan.runs):
            return
        if cifar.is_complete(self.data_root / cifar.FOLDER):
            return
        if self.quick:
            make_quick_data(self.data_root)
            return
        print(f"[plan] CIFAR-10 into {self.data_root / cifar.FOLDER}", flush=True)
        try:
            cifar.download(self.data_root)
        except DatasetError as e:
            raise PlanFailed(f"CIFAR-10 is not in {self.data_root} and could not be downloaded here: run `make data` "
                             f"(python -m vit.commands.data --root {self.data_root}) where there is network") from e

    def folders(self) -> Path:
        """Fashion-MNIST as image folders, DATA_ROOT/fashion-mnist-folders, made once from
        DATA_ROOT/FashionMNIST (torchvision downloads its files there when missing; --quick: generated)."""
        out = self.data_root / "fashion-mnist-folders"
        if not out.is_dir():
            from vit.exits import DatasetError
            from vit.folders import fashion_mnist_folders, write_fake_raw

            if self.quick:
                write_fake_raw(self.data_root)
            print(f"[plan] Fashion-MNIST as image folders: {out}", flush=True)
            try:
                fashion_mnist_folders(self.data_root, out, download=not self.quick)
            except DatasetError as e:
                raise PlanFailed(str(e)) from None
        return out

    def train_command(self, job: Run) -> list[str]:
        root = self.data_root if job.data == "cifar" else self.folders()
        return [*program(self.tree(job), "train"), *job.args, "--data.root", str(root),
                "--trainer.default_root_dir", str(self.runs_root / job.table), "--run", job.name,
                "--ckpt_path", "last", *self.bound("--stop_after_minutes"), *(QUICK_TRAIN if self.quick else ())]

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
        """With a results folder: the run's record copied there, with its row's label."""
        if self.results_dir is None:
            print(f"[plan] record: {record}", flush=True)
            return
        path = self.record_path(job)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"row": job.label, **results.read(record)}, indent=2) + "\n")
        print(f"[plan] record: {path}", flush=True)


def make_quick_data(root: Path) -> Path:
    """A small CIFAR-10 in the official format (a learnable task: each class has its colour), for --quick."""
    from vit.cifar import write_fake

    return write_fake(root)


# --- SLURM -------------------------------------------------------------------------------------------------
def sbatch_script(plan: Plan, runner: Runner) -> str:
    """One SLURM job array for the plan: task i runs the plan's run i alone (its vit-train or vit-benchmark
    command, as ``runner`` would start it here), with the resources the plan names. What the runs need is
    made now, on the machine that submits (a commit's checkout, Fashion-MNIST's folders)."""
    r = plan.resources
    out = runner.runs_root / plan.table
    commands = []
    for job in plan.runs:
        record = runner.own_record(job)
        if isinstance(job, Benchmark):
            record.parent.mkdir(parents=True, exist_ok=True)  # its report's folder (benchmark-TABLE)
            command, where, srun = runner.benchmark_command(job, record), REPO, "srun --ntasks=1"
        else:
            command, where, srun = runner.train_command(job), runner.tree(job), "srun"
        prefix = f"cd {shlex.quote(str(where))} && " + (
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
        f"#SBATCH --ntasks={max(1, r['gpus'])}",
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
