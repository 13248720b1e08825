"""Reading and checking a plan file (its schema: vit/plans/__init__.py's docstring): ``load`` gives a
``Plan`` of expanded ``Run``s and ``Benchmark``s, or raises ConfigError naming the file and the key."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from vit.training.commits import REPO
from vit.exits import ConfigError, RunFailed, Stopped, status_of

EXPERIMENTS = REPO / "experiments"  # the plans of README's and docs/' tables (a checkout's, not the package's)
STOPPED = status_of(Stopped())  # vit-train's exit status for a run that stopped where it resumes (4)
NAME = re.compile(r"[A-Za-z0-9][\w-]*")
RESERVE_SECONDS, RESERVE_SHARE = 20, 0.2  # of a run's budget, not for training: start-up, compile, test
PLAN_KEYS = {"table", "args", "seeds", "minutes", "budget_minutes", "resources", "runs", "history"}
RUN_KEYS = {"name", "label", "args", "seeds", "minutes", "data", "commit", "benchmark"}
RESOURCE_KEYS = {"cpus": 1, "gpus": 0, "memory": None, "time": None, "at_once": 1}  # None: the cluster's default
DATA = {"cifar": "vit.data.CIFAR10DataModule",  # a run's data: the data module it trains with
        "fashion-mnist": "vit.data.ImageFolderDataModule"}  # (Fashion-MNIST written as image folders)
# options a plan sets itself for each run (after its args): on a run's command line they are refused
OWNED = {"--seed_everything": "seeds", "--trainer.max_time": "minutes", "--data": "data",
         "--data.class_path": "data", "--data.root": "data (the data root: --data-root)",
         "--trainer.default_root_dir": "its run folder (--runs)", "--run": "its run folder (the run's name)",
         "--ckpt_path": "its run folder (a run continues from its last checkpoint)"}


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
    args: tuple[str, ...]  # the plan's args, then the run's own (``own``)
    commit: str | None = None
    data: str = "cifar"
    change: str = ""  # the plan's run it expands (its name without the seed)
    own: tuple[str, ...] = ()  # that run's own arguments (beside the plan's)
    seed: int | None = None  # the plan's seed for it (None: the recipe's)
    minutes: float | None = None  # the plan's budget for it (None: the recipe's)
    gpus: int = 0  # the GPUs it trains on (the plan's resources.gpus): which recipe runs where its args name none

    def owned(self, scale: float = 1.0) -> tuple[str, ...]:
        """What the plan sets for this run, given after its args so that no recipe or argument overrides it: its
        seed and training time (when the plan gives a budget: ``training_minutes`` of it, times ``scale``) and its
        data module (``data``; the root: ``Runner``)."""
        return (*(("--seed_everything", str(self.seed)) if self.seed is not None else ()),
                *(("--trainer.max_time", max_time(training_minutes(self.minutes * scale)))
                  if self.minutes is not None else ()),
                "--data", DATA[self.data])


@dataclass(frozen=True)
class Benchmark:
    """One ``vit-benchmark`` with ``args``: its report is the record of the row ``label`` of ``table``."""

    table: str
    name: str
    label: str
    args: tuple[str, ...] = ()
    change: str = ""
    minutes: float | None = None  # its budget: vit-benchmark --minutes (None: unbounded)


@dataclass(frozen=True)
class Plan:
    path: Path
    table: str
    runs: tuple[Run | Benchmark, ...]  # expanded, in the table's order
    resources: dict = field(default_factory=lambda: dict(RESOURCE_KEYS))
    history: bool = False
    budget_minutes: float | None = None  # the whole plan's wall budget (vit-figures --total-minutes' default)

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


def training_minutes(minutes: float) -> float:
    """The training time (``--trainer.max_time``) of a run whose whole command has a budget of ``minutes``: that,
    less a reserve for its start-up, first compile, validation and test (RESERVE_SECONDS and RESERVE_SHARE of it)."""
    return max(minutes * (1 - RESERVE_SHARE) - RESERVE_SECONDS / 60, minutes / 10)


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


def _refuse_owned(words: tuple[str, ...], path: Path, key: str, run: Run) -> None:
    """An option the plan sets itself for ``run`` (OWNED: its seed and budget where the plan gives them, its data
    module, data root and run folder) written in the args: refused, naming the plan key that sets it. A data
    module named as ``data:`` names it is the same setting, not refused."""
    for i, word in enumerate(words):
        option, equals, value = word.partition("=")
        value = value if equals else (words[i + 1] if i + 1 < len(words) else "")
        if option not in OWNED or option == "--seed_everything" and run.seed is None \
                or option == "--trainer.max_time" and run.minutes is None \
                or option in ("--data", "--data.class_path") and value == DATA[run.data]:
            continue
        raise _fail(path, key, f"{option} is the plan's to set ({OWNED[option]}), not an argument of its runs")


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
    budget = _minutes(data["budget_minutes"], path, "budget_minutes") if "budget_minutes" in data else None
    resources = _resources(data.get("resources"), path)
    history = data.get("history", False)
    if not isinstance(history, bool):
        raise _fail(path, "history", "takes true or false")
    entries = data.get("runs")
    if not isinstance(entries, list) or not entries:
        raise _fail(path, "runs", "takes a list of runs, each with a name (and label, args, seeds, ...)")
    runs: list[Run | Benchmark] = []
    changes: dict[str, tuple[int, dict]] = {}  # each entry's name: its first entry (index, entry)
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
        if name in changes:  # one change, more seeds (a table's row); never another run under its name
            j, earlier = changes[name]
            other = next((k for k in sorted(set(entry) | set(earlier)) if k != "seeds"
                          and entry.get(k) != earlier.get(k)), None)
            if other is not None:
                raise _fail(path, f"{where}.name", f"{name} is also runs[{j}]'s, with another {other}: a name is "
                                                    "one run of the table; name this one otherwise")
        changes[name] = (i, entry)
        if "benchmark" in entry:
            for key in ("args", "seeds", "data", "commit"):
                if key in entry:
                    raise _fail(path, f"{where}.{key}", "a benchmark takes only name, label, minutes and benchmark")
            words = _words(entry["benchmark"], path, f"{where}.benchmark")
            if "--minutes" in words:
                raise _fail(path, f"{where}.benchmark", "--minutes is the plan's to set (minutes)")
            runs.append(Benchmark(f"benchmark-{table}", name, label, words, name,
                                  _minutes(entry["minutes"], path, f"{where}.minutes") if "minutes" in entry else None))
            continue
        args = _words(entry.get("args", []), path, f"{where}.args")
        run_seeds = _seeds(entry["seeds"], path, f"{where}.seeds") if "seeds" in entry else seeds
        run_minutes = _minutes(entry["minutes"], path, f"{where}.minutes") if "minutes" in entry else minutes
        data_kind = entry.get("data", "cifar")
        if not isinstance(data_kind, str) or data_kind not in DATA:
            raise _fail(path, f"{where}.data", f"one of {', '.join(DATA)}")
        commit = entry.get("commit")
        if commit is not None and (not isinstance(commit, str) or not re.fullmatch(r"[0-9a-f]{7,40}", commit)):
            raise _fail(path, f"{where}.commit", "takes a commit of this repository (7 to 40 hex digits)")
        for seed in run_seeds if run_seeds is not None else (None,):
            suffix = ("", "") if seed is None else (f"-s{seed}", f", seed {seed}")
            run = Run(table, name + suffix[0], label + suffix[1], (*base, *args), commit, data_kind, name, args, seed,
                      run_minutes, resources["gpus"])
            for key, words in (("args", base), (f"{where}.args", args)):
                _refuse_owned(words, path, key, run)
            runs.append(run)
    seen: set[tuple[str, str]] = set()
    for job in runs:
        if (job.table, job.name) in seen:
            raise _fail(path, "runs", f"the run {job.name} comes twice: each run of a plan is one name and seed")
        seen.add((job.table, job.name))
    return Plan(path, table, tuple(runs), resources, history, budget)


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
