"""The measured figures of README and docs/: the runs that measure them on the machine at hand (``make
figures``), the records they leave in ``results/``, and the pages' tables rendered from those records.

A plan is a list of steps; a step is one training run (``vit-train``, one command to its end; with
``minutes``, continued across commands of at most that long through ``--stop_after_minutes`` and
``--ckpt_path last``), several training runs
at once (one pinned CPU core each, so that they share the machine alike), or one benchmark. Each step's
record (the run's ``results.json``, the benchmark's JSON) is copied to ``results/<table>/<name>.json``
with its row's label; the pages' blocks ``<!-- figures: TABLE -->`` … ``<!-- /figures -->`` are rendered
from those files, and a row without a record says "pending".
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from vit import results

REPO = results.REPO
STOPPED = 4  # vit-train's exit status for a run that stopped where it resumes


class FiguresError(RuntimeError):
    """A step failed or README cannot be rendered; the message says which and why."""


@dataclass(frozen=True)
class Run:
    """One training run: ``vit-train`` with ``args``; its record becomes the row ``label`` of ``table``.
    ``commit``: run that commit of this repository instead, from a clone of its own (its code, its recipes).
    ``data``: CIFAR-10 (the data root), or Fashion-MNIST as image folders (``Runner.folders``)."""

    table: str
    name: str
    label: str
    args: tuple[str, ...]
    commit: str | None = None
    data: str = "cifar"  # or "fashion-mnist": image folders made from DATA_ROOT/FashionMNIST (vit.folders)


@dataclass(frozen=True)
class Benchmark:
    """One ``vit-benchmark`` with ``args``: its report is the record of README's benchmark table ``table``."""

    table: str
    name: str
    label: str
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Step:
    """What runs at once: one Run or Benchmark, or several Runs pinned one per CPU core."""

    jobs: tuple[Run | Benchmark, ...]


def _pairs(minutes: int, seed: int, adamw_core: int) -> Step:
    budget = ("--trainer.max_time", f"00:00:{minutes:02d}:00", "--seed_everything", str(seed))
    runs = {opt: Run("muon-horizon", f"{opt}-{minutes}min-s{seed}",
                     f"{'AdamW' if opt == 'adamw' else 'Muon'}, {minutes} min, seed {seed}",
                     ("--config", "cpu", *budget, "--model.optimizer.name", opt)) for opt in ("adamw", "muon")}
    return Step((runs["adamw"], runs["muon"]) if adamw_core == 0 else (runs["muon"], runs["adamw"]))


LEVERS = {"sincos E_pos": ("--model.pos_init", "sincos"), "linear decay": ("--model.decay", "linear"),
          "flip TTA": ("--model.tta_flip", "true")}


def _lever_run(name: str, label: str, levers: tuple[str, ...], seed: int, table: str = "cpu-levers") -> Run:
    args = tuple(a for lever in levers for a in LEVERS[lever])
    return Run(table, f"{name}-s{seed}", f"{label}, seed {seed}", ("--config", "cpu", "--seed_everything",
                                                                   str(seed), *args))


# the cpu recipe's own choices at its 20 epochs, one change each (round 2's second sitting, another machine)
SHAPE_LEVERS = {"patch drop 0.5": ("--model.arch.patch_drop", "0.5"), "MLP 4·D": ("--model.arch.mlp_ratio", "4"),
                "Muon lr 2×": ("--model.optimizer.muon_lr", "4e-3"), "batch 256": ("--data.batch_size", "256"),
                "no label smoothing": ("--model.augmentation.label_smoothing", "0")}
LEVERS.update(SHAPE_LEVERS)


def _shape_pair(a: tuple[str, str, tuple[str, ...]], b: tuple[str, str, tuple[str, ...]], table: str = "cpu-shape",
                seed: int = 0) -> Step:
    return Step(tuple(_lever_run(name, label, levers, seed, table) for name, label, levers in (a, b)))


# less regularisation (the cpu recipe underfits: 81 % train accuracy, augmented, against 79 % validation), an
# EMA of the weights, and the warmup's length (round 2's fourth sitting)
LEVERS.update({"no weight decay": ("--model.optimizer.weight_decay", "0"), "EMA 0.999": ("--model.ema_decay", "0.999"),
               "warmup 0.25 epochs": ("--model.schedule.warmup_epochs", "0.25"), "warmup 3 epochs": ("--model.schedule.warmup_epochs", "3"),
               "warmup 5 epochs": ("--model.schedule.warmup_epochs", "5")})

# mimetic initialisation at two scales, with Muon (the cpu recipe's) and with AdamW (round 2's third sitting)
LEVERS.update({"mimetic 0.7/0.4": ("--model.mimetic", "[0.7, 0.7, 0.4, 0.4]"),
               "mimetic 0.3/0.2": ("--model.mimetic", "[0.3, 0.3, 0.2, 0.2]"),
               "AdamW": ("--model.optimizer.name", "adamw")})

# Muon's Newton–Schulz iteration in timm's bfloat16 (emulated, slow, on a CPU without bf16 units) against the
# recipe's float32 on a CPU
LEVERS.update({"Newton–Schulz in bfloat16": ("--model.muon_ns_dtype", "bfloat16")})
BASELINE = "2f47865"  # round 2's baseline: the cpu recipe of that commit, run from its own checkout


def _baseline_run(seed: int) -> Run:
    return Run("cpu-round2", f"{BASELINE}-s{seed}", f"cpu recipe of {BASELINE} (its checkout), seed {seed}",
               ("--config", "cpu", "--seed_everything", str(seed)), commit=BASELINE)


# the recipe's choices round 2 had not yet measured: its shape, its augmentation's strength, its resize stages
LEVERS.update({"D 96": ("--model.arch.dim", "96", "--model.arch.heads", "6"), "L 6": ("--model.arch.depth", "6"),
               "2 heads": ("--model.arch.heads", "2"), "crop padding 2": ("--data.crop_padding", "2"),
               "Mixup 0.2": ("--model.augmentation.mixup", "0.2"), "no resize stages": ("--model.schedule.resize_stages", "[]"),
               "longer resize stages": ("--model.schedule.resize_stages", "[[16, 0.4], [24, 0.7]]")})


def _fashion_run(commit: str | None) -> Run:
    name, label = (f"{commit}-s0", f"cpu recipe of {commit} (its checkout)") if commit else ("cpu-s0", "cpu recipe")
    return Run("fashion-mnist", name, f"{label}, seed 0", ("--config", "cpu", "--seed_everything", "0", "--data",
                                                           "vit.data.ImageFolderDataModule"), commit, "fashion-mnist")


PLANS: dict[str, list[Step]] = {
    # make figures on a machine without a GPU
    "cpu": [Step((Run("cpu", "01-smoke", "smoke recipe", ("--config", "smoke")),)),
            Step((Run("cpu", "02-cpu", "cpu recipe (10 minutes)", ("--config", "cpu")),)),
            Step((Run("cpu", "03-fashion-mnist", "cpu recipe, Fashion-MNIST as image folders (10 minutes)",
                      ("--config", "cpu", "--data", "vit.data.ImageFolderDataModule"), data="fashion-mnist"),)),
            Step((Benchmark("benchmark-cpu", "cpu", "CPU benchmark"),))],
    # make figures on a GPU: time to 94 % and the default recipe first
    "gpu": [Step((Run("gpu", "01-vit_cifar10_fast", "vit_cifar10_fast (time to accuracy)",
                      ("--config", "vit_cifar10_fast")),)),
            Step((Run("gpu", "02-vit_cifar10", "vit_cifar10, the default recipe (100 epochs)",
                      ("--config", "vit_cifar10")),)),
            Step((Benchmark("benchmark-gpu", "gpu", "GPU benchmark, eager"),)),
            Step((Benchmark("benchmark-gpu", "gpu-compiled", "GPU benchmark, torch.compile",
                            ("--sections", "model,step", "--compile")),))],
    # AdamW against Muon at the cpu recipe's shape over a short and a 3× longer budget, both at once
    "muon-horizon": [_pairs(10, 0, 0), _pairs(30, 0, 1), _pairs(10, 1, 1)],
    # the cpu recipe against it with three free levers (issue: accuracy per second, round 2), pinned in pairs
    "cpu-levers": [Step((_lever_run("cpu", "cpu recipe", (), 0), _lever_run("all3", "+ all three", tuple(LEVERS), 0))),
                   Step((_lever_run("all3", "+ all three", tuple(LEVERS), 1), _lever_run("cpu", "cpu recipe", (), 1))),
                   Step((_lever_run("sincos", "+ sincos E_pos", ("sincos E_pos",), 0),
                         _lever_run("linear", "+ linear decay", ("linear decay",), 0)))],
    # the recipe's own choices, one at a time against it, seed 0, pinned in pairs
    "cpu-shape": [_shape_pair(("cpu", "cpu recipe", ()), ("drop50", "+ patch drop 0.5", ("patch drop 0.5",))),
                  _shape_pair(("mlp4", "+ MLP 4·D", ("MLP 4·D",)), ("muonlr", "+ Muon lr 2×", ("Muon lr 2×",))),
                  _shape_pair(("nols", "+ no label smoothing", ("no label smoothing",)),
                              ("b256", "+ batch 256", ("batch 256",))),
                  Step((Benchmark("benchmark-cpu-levers", "levers", "The cpu recipe's fast paths",
                                  ("--device", "cpu", "--sections", "levers", "--compile", "--rounds", "3")),))],
    # mimetic initialisation's scales with either optimizer, and the seed-0 winner of cpu-shape again with seed 1
    "cpu-mimetic": [_shape_pair(("cpu", "cpu recipe", ()), ("mim7-adamw", "+ mimetic 0.7/0.4, AdamW",
                                                              ("mimetic 0.7/0.4", "AdamW")), "cpu-mimetic"),
                    _shape_pair(("mim3", "+ mimetic 0.3/0.2", ("mimetic 0.3/0.2",)), ("adamw", "+ AdamW", ("AdamW",)),
                                "cpu-mimetic"),
                    _shape_pair(("mim3-adamw", "+ mimetic 0.3/0.2, AdamW", ("mimetic 0.3/0.2", "AdamW")),
                                ("mim7", "+ mimetic 0.7/0.4", ("mimetic 0.7/0.4",)), "cpu-mimetic"),
                    _shape_pair(("nols", "+ no label smoothing", ("no label smoothing",)), ("cpu", "cpu recipe", ()),
                                "cpu-mimetic", seed=1)],
    # no weight decay, an EMA, a shorter and a longer warmup; no label smoothing with no weight decay
    "cpu-regularisation": [
        _shape_pair(("nowd", "+ no weight decay", ("no weight decay",)), ("ema", "+ EMA 0.999", ("EMA 0.999",)),
                    "cpu-regularisation"),
        _shape_pair(("warm025", "+ warmup 0.25 epochs", ("warmup 0.25 epochs",)),
                    ("warm3", "+ warmup 3 epochs", ("warmup 3 epochs",)), "cpu-regularisation"),
        _shape_pair(("cpu", "cpu recipe", ()), ("nols-nowd", "+ no label smoothing, no weight decay",
                                                ("no label smoothing", "no weight decay")), "cpu-regularisation"),
        # then the first pairs' winner again with seed 1, and a longer warmup still
        _shape_pair(("warm3", "+ warmup 3 epochs", ("warmup 3 epochs",)), ("warm5", "+ warmup 5 epochs", ("warmup 5 epochs",)),
                    "cpu-regularisation", seed=1)],
    # round 2 decided: the cpu recipe against 2f47865's (run from its own checkout), 2 seeds, pinned in pairs with
    # the cores alternating; then the Newton–Schulz lever alone (both seeds), and its images/s
    "cpu-round2": [
        Step((_baseline_run(0), _lever_run("cpu", "cpu recipe", (), 0, "cpu-round2"))),
        Step((_lever_run("cpu", "cpu recipe", (), 1, "cpu-round2"), _baseline_run(1))),
        Step((_lever_run("nsbf16", "+ Newton–Schulz in bfloat16 (timm's)", ("Newton–Schulz in bfloat16",), 0, "cpu-round2"),
              _lever_run("nsbf16", "+ Newton–Schulz in bfloat16 (timm's)", ("Newton–Schulz in bfloat16",), 1, "cpu-round2"))),
        Step((Benchmark("benchmark-cpu-levers", "levers-muon", "The cpu recipe's fast paths, with Muon",
                        ("--device", "cpu", "--sections", "levers", "--compile", "--rounds", "3")),))],
    # the recipe's shape (D, L, heads), its augmentation (weaker crops, light Mixup) and its resize stages (none,
    # longer), one change each against it, seed 0, pinned in pairs
    "cpu-choices": [
        _shape_pair(("cpu", "cpu recipe", ()), ("d96", "+ D 96 (6 heads)", ("D 96",)), "cpu-choices"),
        _shape_pair(("l6", "+ L 6", ("L 6",)), ("h2", "+ 2 heads", ("2 heads",)), "cpu-choices"),
        _shape_pair(("pad2", "+ crop padding 2", ("crop padding 2",)), ("nostages", "+ no resize stages",
                                                                        ("no resize stages",)), "cpu-choices"),
        _shape_pair(("stages", "+ longer resize stages (16 px to 0.4, 24 px to 0.7)", ("longer resize stages",)),
                    ("mixup", "+ Mixup 0.2", ("Mixup 0.2",)), "cpu-choices")],
    # the cpu recipe on Fashion-MNIST as image folders against 2f47865's (its checkout), pinned as a pair
    "fashion-mnist": [Step((_fashion_run(BASELINE), _fashion_run(None)))],
    # is the cpu recipe starved on image folders (each image read and decoded in the training process)? Its 0
    # data workers against 2, one run after the other with both cores each (workers need cores of their own)
    "fashion-workers": [Step((Run("fashion-workers", f"w{n}-s0", f"cpu recipe, {n} data workers, seed 0",
                                  ("--config", "cpu", "--seed_everything", "0", "--data", "vit.data.ImageFolderDataModule",
                                   "--data.num_workers", str(n)), data="fashion-mnist"),)) for n in (0, 2)],
}

# --quick: every step of every plan at toy scale on CPU, on generated data
QUICK_TRAIN = ("--model.arch.dim", "16", "--model.arch.depth", "1", "--model.arch.heads", "2",
               "--model.compile", "false", "--trainer.accelerator", "cpu", "--trainer.precision", "32-true",
               "--trainer.max_epochs", "2", "--trainer.max_time", "null", "--data.batch_size", "50",
               "--data.val_size", "100", "--data.num_workers", "0", "--data.auto_augment", "null")
QUICK_BENCH = ("--quick", "--device", "cpu", "--sections", "model,step")  # (test_benchmark runs every section)


def default_plan() -> str:
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


# --- running -----------------------------------------------------------------------------------------
@dataclass
class Runner:
    data_root: Path
    runs_root: Path
    results_dir: Path
    minutes: float | None = None  # each command's wall-clock bound; None: each run and benchmark whole
    quick: bool = False
    max_commands: int | None = None  # stop after this many commands (a lease of a few commands)
    commands: int = field(default=0)
    quick_report: Path | None = None  # --quick: the one benchmark's report

    def record_path(self, job: Run | Benchmark) -> Path:
        return self.results_dir / job.table / f"{job.name}.json"

    def tree(self, job: Run) -> Path:
        """Where the job's code is: this checkout, or a clone of the job's commit under the runs folder."""
        if job.commit is None:
            return REPO
        tree = self.runs_root / "checkouts" / job.commit[:7]
        if not tree.is_dir():
            if subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{job.commit}^{{commit}}"]).returncode:
                raise FiguresError(f"{job.table}/{job.name} runs commit {job.commit}, which this clone does not have "
                                   "(a shallow clone? `git fetch --unshallow` brings it)")
            subprocess.run(["git", "clone", "--quiet", "--shared", "--no-checkout", str(REPO), str(tree)], check=True)
            subprocess.run(["git", "-C", str(tree), "checkout", "--quiet", "--detach", job.commit], check=True)
            # its recipes as its package (pyproject's package-dir maps configs/ to vit.configs), so that
            # PYTHONPATH=tree imports its vit and its recipes, never this checkout's (an untracked link)
            (tree / "vit" / "configs").symlink_to(Path("..") / "configs")
        return tree

    def folders(self) -> Path:
        """Fashion-MNIST as image folders, DATA_ROOT/fashion-mnist-folders, made once from
        DATA_ROOT/FashionMNIST (torchvision downloads its files there when missing; --quick: generated)."""
        out = self.data_root / "fashion-mnist-folders"
        if not out.is_dir():
            from vit.exits import DatasetError
            from vit.folders import fashion_mnist_folders, write_fake_raw

            if self.quick:
                write_fake_raw(self.data_root)
            print(f"[figures] Fashion-MNIST as image folders: {out}", flush=True)
            try:
                fashion_mnist_folders(self.data_root, out, download=not self.quick)
            except DatasetError as e:
                raise FiguresError(str(e)) from None
        return out

    def train_command(self, job: Run) -> list[str]:
        root = self.data_root if job.data == "cifar" else self.folders()
        return [sys.executable, str(self.tree(job) / "scripts" / "train.py"), *job.args, "--data.root", str(root),
                "--trainer.default_root_dir", str(self.runs_root / job.table), "--run", job.name,
                "--ckpt_path", "last", *self.bound("--stop_after_minutes"), *(QUICK_TRAIN if self.quick else ())]

    def bound(self, option: str) -> tuple[str, ...]:
        """``option minutes`` for a command when a bound was asked for (--minutes), else nothing."""
        return (option, f"{self.minutes:g}") if self.minutes is not None else ()

    def run_step(self, step: Step) -> bool:
        """Run the step's jobs to their end (False: stopped for --max-commands; run again to continue)."""
        todo = [job for job in step.jobs if not self.record_path(job).is_file()]
        while todo:
            if self.max_commands is not None and self.commands >= self.max_commands:
                return False
            self.commands += 1
            if isinstance(todo[0], Benchmark):
                if self.benchmark(todo[0]):
                    todo.pop(0)
                continue
            codes = self.train_at_once(todo)
            for job, code in zip(list(todo), codes):
                if code == 0:
                    self.collect(self.runs_root / job.table / job.name / results.FILE, job)
                    todo.remove(job)
                elif code != STOPPED:
                    raise FiguresError(f"{job.table}/{job.name}: vit-train exited {code} (its output is above)")
        return True

    def train_at_once(self, jobs: list[Run]) -> list[int]:
        """Each job as one command (of at most ``minutes`` when given); several at once get one CPU core and
        one thread each."""
        pinned = len(jobs) > 1
        procs = []
        for core, job in enumerate(jobs):
            command = self.train_command(job)
            print(f"[figures] {shlex.join(command[1:])}" + (f"   (core {core})" if pinned else ""), flush=True)
            env = {**os.environ, **({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"} if pinned else {})}
            tree = self.tree(job)
            if job.commit:  # its own package first (before this checkout's installed one)
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
            affinity = (lambda c=core: os.sched_setaffinity(0, {c})) if pinned else None
            procs.append(subprocess.Popen(command, env=env, preexec_fn=affinity, cwd=tree))
        return [p.wait() for p in procs]

    def benchmark_command(self, job: Benchmark, out: Path) -> list[str]:
        return [sys.executable, str(REPO / "scripts" / "benchmark.py"), *(QUICK_BENCH if self.quick else job.args),
                "--output", str(out), *self.bound("--minutes")]

    def benchmark(self, job: Benchmark) -> bool:
        """One command of the benchmark, bounded by ``minutes`` (when given) as a training command is (False:
        it stopped with sections left, which the next command measures)."""
        out = self.runs_root / job.table / f"{job.name}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        if self.quick_report:  # --quick runs one command for every benchmark: it runs once
            print(f"[figures] {job.table}/{job.name}: the --quick benchmark's report, {self.quick_report}", flush=True)
            shutil.copyfile(self.quick_report, out)
        else:
            command = self.benchmark_command(job, out)
            print(f"[figures] {shlex.join(command[1:])}", flush=True)
            code = subprocess.run(command, cwd=REPO).returncode
            if code == STOPPED:
                return False
            if code:
                raise FiguresError(f"{job.table}/{job.name}: vit-benchmark exited {code} (its output is above)")
            if self.quick:
                self.quick_report = out
        self.collect(out, job)
        return True

    def collect(self, record: Path, job: Run | Benchmark) -> Path:
        path = self.record_path(job)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"row": job.label, **results.read(record)}, indent=2) + "\n")
        print(f"[figures] record: {path}", flush=True)
        return path


def make_quick_data(root: Path) -> Path:
    """A small CIFAR-10 in the official format (a learnable task: each class has its colour), for --quick."""
    from vit.cifar import write_fake

    return write_fake(root)


def measure(plans: list[str], runner: Runner) -> bool:
    """Run the plans' steps in order (True: all done; False: stopped by --max-commands)."""
    for plan in plans:
        for step in PLANS[plan]:
            if not runner.run_step(step):
                return False
    return True


# --- rendering ---------------------------------------------------------------------------------------
BLOCK = re.compile(r"(<!-- figures: (?P<table>[\w-]+) -->\n)(?P<body>.*?)(<!-- /figures -->)", re.S)
HIDDEN = {"--data.root", "--trainer.default_root_dir", "--run", "--ckpt_path", "--stop_after_minutes", "--output",
          "--minutes"}


def jobs_of(table: str) -> list[Run | Benchmark]:
    """The table's rows in plan order (the jobs of a step that run at once: by name)."""
    return [job for steps in PLANS.values() for step in steps
            for job in sorted(step.jobs, key=lambda j: j.name) if job.table == table]


def shown_command(command: str) -> str:
    """The recorded command without what only places files (data root, run folder, chunking)."""
    words, shown, skip = shlex.split(command), [], False
    for word in words[2 if words[:1] == ["python"] else 1:]:
        if skip:
            skip = False
        elif word in HIDDEN:
            skip = True
        else:
            shown.append(word)
    return shlex.join(shown)


def _device(r: dict) -> str:
    if r.get("device") != r.get("cpu"):
        versions = ", ".join(f"{label} {r[key]}" for key, label in (("cuda", "CUDA"), ("driver", "driver")) if r.get(key))
        return f"{r['device_count']}× {r['device']}" + (f" ({versions})" if versions else "")
    threads, units = r.get("torch_threads"), r.get("cpu_bf16")
    cpu = r["cpu"] + (f" ({', '.join(units)})" if units else " (no bf16 units)" if units == [] else "")
    return f"{cpu}, {threads} thread{'s' * (threads != 1)}" if threads else cpu


def _provenance(path: Path, r: dict, base: Path) -> str:
    commit = (r.get("commit") or "no commit")[:7] + ("+dirty" if r.get("dirty") else "")
    return f"[{path.stem}]({Path(os.path.relpath(path, base)).as_posix()}) `{commit}` {r['date'][:10]}"


def render_runs(table: str, results_dir: Path, base: Path) -> str:
    jobs = jobs_of(table)
    records = {job.name: (results_dir / table / f"{job.name}.json") for job in jobs}
    present = {name: results.read(p) for name, p in records.items() if p.is_file()}
    timed = any("time_to_val_acc" in r for r in present.values())
    head = ["run", "command", "device", "epochs", "training", "best val", "test top-1 (top-5)", "train img/s"]
    head += ["time to 90 / 93 / 94 %"] if timed else []
    lines = ["| " + " | ".join(head + ["record"]) + " |", "|" + " --- |" * (len(head) + 1)]
    for job in jobs:
        r = present.get(job.name)
        if r is None:
            cells = [job.label, f"`{shlex.join(job.args)}`"] + ["pending"] * (len(head) - 2) + ["—"]
        else:
            reached = r.get("time_to_val_acc", {})
            cells = [r.get("row", job.label), f"`{shown_command(r['command'])}`", _device(r), f"{r['epochs']:g}",
                     f"{r['training_seconds'] / 60:.1f} min", f"{r['best_val_acc']:.2f} %",
                     f"**{r['test_top1']:.2f} %** ({r['test_top5']:.2f} %)", f"{r['train_images_per_second']:,.0f}"]
            if timed:  # the clock includes each command's first batches, where torch.compile compiles again
                compiles = f" (the clock includes the first batches of {r['commands']} command(s): " \
                    f"{r['first_batches_seconds']:.0f} s)" \
                    if r.get("commands") else ""
                cells.append(" / ".join(f"{reached[t]:.0f} s" if t in reached else "—" for t in ("0.90", "0.93", "0.94"))
                             + compiles)
            cells.append(_provenance(records[job.name], r, base))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _bench_rows(r: dict) -> list[list[str]]:
    """(what, ours, reference, ratio, target) rows of one benchmark report."""
    def n(x):
        return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"

    rows = []
    for m in r.get("model", []):
        what = f"{m['preset']}, batch {m['batch_size']}, {m['dtype']}" + (", compiled" if m.get("compiled") else "")
        for mode, name in (("train", "train step"), ("infer", "inference")):
            rows.append([f"{name}, {what} (img/s)", n(m[f"{mode}_img_s_ours"]), f"timm {n(m[f'{mode}_img_s_timm'])}",
                         f"**{m[f'{mode}_ratio']:.2f}**", "≥ 1.0"])
            if f"{mode}_peak_MiB_ours" in m:
                rows.append([f"{name} peak memory, {what} (MiB)", n(m[f"{mode}_peak_MiB_ours"]),
                             f"timm {n(m[f'{mode}_peak_MiB_timm'])}",
                             f"{m[f'{mode}_peak_MiB_ours'] / m[f'{mode}_peak_MiB_timm']:.2f}", "≤ 1.0"])
    for e in r.get("patch_embedding", []):
        rows.append([f"patch embedding E fwd+bwd, {e['preset']} (img/s)", f"{n(e['img_s_ours'])} (patchify + Linear)",
                     f"{n(e['img_s_conv'])} (timm strided conv)", f"**{e['ratio']:.2f}**", "≥ 1.0"])
    for d in r.get("data", []):
        rows.append(["data path: crop + flip + normalise (img/s)", f"{n(d['img_s_ours_device'])} (device path)",
                     f"{n(d['img_s_torchvision'])} (torchvision + PIL, DataLoader)",
                     f"**{d['ratio_device_vs_torchvision']:.1f}**", "≥ 5"])
        rows.append(["data path, our worker path (img/s)", n(d["img_s_ours_workers"]), n(d["img_s_torchvision"]),
                     f"{d['ratio_workers_vs_torchvision']:.2f}", "—"])
    for s in r.get("step", []):
        mfu = f", MFU {100 * s['mfu']:.1f} %" if s.get("mfu") else ""
        rows.append([f"whole training step, {s['preset']}, batch {s['batch_size']}, {s['dtype']}"
                     + (", compiled" if s.get("compiled") else "") + " (img/s)",
                     f"{n(s['img_s'])} ({s['achieved_tflops']:.3g} TFLOP/s{mfu})", "—", "—", "—"])
    levers = r.get("levers", [])
    fp32 = {(v["threads"], v["compiled"]): v["img_s"] for v in levers
            if v["dtype"] == "float32" and v.get("optimizer", "adamw") == "adamw"}
    muon = {(v["threads"], v["optimizer"]): v["img_s"] for v in levers if v.get("optimizer", "adamw") != "adamw"}
    for (threads, optimizer), img_s in muon.items():
        if optimizer == "muon, NS float32":
            timms = muon[(threads, "muon, NS bfloat16")]
            rows.append([f"{levers[0]['model']}'s training step with Muon, batch {levers[0]['batch_size']}, {threads} "
                         f"thread{'s' * (threads != 1)}: Newton–Schulz in float32 against bfloat16 (timm's) (img/s)",
                         n(img_s), f"bfloat16 {n(timms)}", f"**{img_s / timms:.2f}**", "—"])
    for v in levers:
        if v.get("optimizer", "adamw") == "adamw" and (v["dtype"] != "float32" or v["compiled"]):
            what = "bf16 autocast" if v["dtype"] != "float32" else "torch.compile"
            rows.append([f"{v['model']}'s training step, batch {v['batch_size']}, {v['threads']} thread"
                         f"{'s' * (v['threads'] != 1)}: {what} against fp32 eager (img/s)", n(v["img_s"]),
                         f"fp32 eager {n(fp32[(v['threads'], False)])}", f"**{v['img_s'] / fp32[(v['threads'], False)]:.2f}**",
                         "—"])
    if "classify" in r:
        c = r["classify"]
        rows.append([f"classify {c['images']:,} photos, {c['workers']} decoding workers vs the main process (img/s)",
                     n(c["img_s_workers"]), n(c["img_s_one_process"]), f"**{c['ratio']:.2f}**", "≥ 1.6"])
    if "startup" in r:
        s = r["startup"]
        rows.append(["classify one image from the shell (s)", f"{s['s_classify']:.2f}",
                     f"`import torch, torchvision` {s['s_import']:.2f}", f"**{s['ratio']:.2f}**", "≤ 1.5"])
    return rows


def _judged(ratio: str, target: str) -> str:
    """The target, and "not met" when the measured ratio misses it."""
    if target == "—":
        return target
    value, (sign, bound) = float(ratio.strip("*")), target.split()
    met = value >= float(bound) if sign == "≥" else value <= float(bound)
    return target if met else f"{target}: **not met**"


def render_benchmark(table: str, results_dir: Path, base: Path) -> str:
    lines = []
    for job in jobs_of(table):
        path = results_dir / table / f"{job.name}.json"
        if not path.is_file():
            lines.append(f"*{job.label}*: pending (`{shlex.join(['scripts/benchmark.py', *job.args])}` "
                         f"on such a machine; none was available).\n")
            continue
        r = results.read(path)
        lines.append(f"*{r.get('row', job.label)}*: {_device(r)}, torch {r['versions']['torch']}, "
                     f"`{shlex.join(['scripts/benchmark.py', *shlex.split(shown_command(r['command']))])}`, "
                     f"record {_provenance(path, r, base)}.\n")
        lines.append("| what | ours | reference | ratio | target |\n| --- | --- | --- | --- | --- |")
        lines += ["| " + " | ".join(row[:4] + [_judged(row[3], row[4])]) + " |" for row in _bench_rows(r)]
        lines.append("")
    return "\n".join(lines)


def pages() -> list[Path]:
    """The pages whose figures blocks are rendered: README and docs/*.md."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def render(text: str, results_dir: Path, base: Path) -> str:
    """A page's text (README's, a docs page's) with every figures block rendered from the records in
    ``results_dir``, their links relative to ``base``, the page's folder."""
    def block(m: re.Match) -> str:
        table = m["table"]
        if not jobs_of(table):
            raise FiguresError(f"a page names a figures table {table!r} that no plan measures")
        body = render_benchmark(table, results_dir, base) if table.startswith("benchmark") else \
            render_runs(table, results_dir, base)
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(block, text)


def quick_dirs(results_dir: Path) -> tuple[Path, Path]:
    """--quick's data and runs, beside its records (so that the same command continues a stopped run)."""
    quick = results_dir / ".quick"
    return make_quick_data(quick / "data"), quick / "runs"  # (the same files each time: rng seed 0)
