"""A run's record, ``results.json`` in its folder: what was measured and what made it (recipe, command line,
commit, machine, versions). Written when the test ends; README's results tables are rendered from copies.

``"dirty": true``: made with uncommitted changes, kept in the file that ``"diff"`` names; ``"dirty": null``: git
could not tell. ``"other_code"``: other code that commands of the run ran (e.g. resumed on another commit).
``"corrected"``: fields filled in by hand, ``{"fields": [...], "from": "<source record, relative to this
folder>", "why": "..."}``. The tables mark each of these."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from vit.training import commits

FILE = "results.json"


def keep_diff(path: Path, record: dict) -> None:
    """Write a dirty record's diff beside it as ``<record>.diff``, named in ``record["diff"]``.
    A failure (a full disk) only warns: it must never cost the record."""
    diff = commits.this_tree()[1]
    if not (record.get("dirty") and "diff" not in record and diff is not None):
        return
    target = path.with_name(path.stem + ".diff")
    try:
        write_whole(target, diff)
    except OSError as e:
        print(f"warning: the diff of the uncommitted changes the record {path} was made from was not kept "
              f"({target}: {e.strerror or e})", file=sys.stderr, flush=True)
        return
    record["diff"] = target.name


def write_whole(path: Path, data: str | bytes) -> None:
    """Write whole or not at all: a stopped write leaves no torn file."""
    part = path.with_name(f".{path.name}.part")
    try:
        part.write_bytes(data) if isinstance(data, bytes) else part.write_text(data)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_bf16_units() -> list[str]:
    """The CPU's bf16 units (Linux's flags avx512_bf16, amx_bf16): without them torch emulates bf16 matmuls."""
    try:
        flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), [])
    except OSError:
        return []
    return [f for f in ("avx512_bf16", "amx_bf16") if f in flags]


def gpu_driver() -> str | None:
    """The NVIDIA driver's version from nvidia-smi, or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    version = out.stdout.split("\n", 1)[0].strip() if out.returncode == 0 else ""
    return version or None


def machine(accelerator: str, devices: int) -> dict:
    """What decides speed: the device and its count, CUDA and driver versions, the CPU, its threads and cores."""
    import torch

    cpu = {"cpu": cpu_model(), "cpu_bf16": cpu_bf16_units(),
           "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
           "torch_threads": torch.get_num_threads()}
    if accelerator == "cuda" and torch.cuda.is_available():
        return {"device": torch.cuda.get_device_name(), "device_count": devices, "cuda": torch.version.cuda,
                "driver": gpu_driver(), **cpu}
    return {"device": cpu["cpu"], "device_count": devices, **cpu}


def versions() -> dict:
    import lightning
    import timm
    import torch

    from vit import __version__

    return {"python": platform.python_version(), "torch": torch.__version__, "lightning": lightning.__version__,
            "timm": timm.__version__, "vit": __version__}


def command_line(argv: list[str], command: str = "train") -> str:
    """The command as the user typed it: ``python scripts/NAME.py ...`` or ``vit-NAME ...``."""
    import shlex

    program = f"python scripts/{command}.py" if Path(sys.argv[0]).name == f"{command}.py" else f"vit-{command}"
    return " ".join([program, *map(shlex.quote, argv)])


def provenance(argv: list[str], command: str, accelerator: str, devices: int) -> dict:
    """What made a figure: the command line, the commit, the date, the machine and the versions."""
    return {"command": command_line(argv, command), **commits.commit(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            **machine(accelerator, devices), "versions": versions()}


def other_code(clock: dict) -> list[dict]:
    """The code other than this command's that the run's commands ran, each with its count of ``commands``.

    Commands the checkpoint does not describe count as ``"commit": "not known"``. Installs without git have
    commit None everywhere, so they are not told apart."""
    this = commits.code()
    raw = clock.get("trees")
    trees = [commits.code_of(t) for t in raw] if isinstance(raw, list) else []
    commands = clock.get("commands")
    if isinstance(commands, int) and commands > len(trees):
        trees += [dict(commits.NOT_KNOWN)] * (commands - len(trees))
    elif isinstance(commands, int) and commands >= 0:  # more entries than commands (crafted): the last
        trees = trees[len(trees) - commands:]
    others: dict[tuple, int] = {}
    for t in trees:
        if t != this:
            key = (t["commit"], t["dirty"], t["changes"])
            others[key] = others.get(key, 0) + 1
    return [{"commit": c, "dirty": d, "changes": h, "commands": n} for (c, d, h), n in others.items()]


def make(*, recipe: str, argv: list[str], accelerator: str, devices: int, metrics: dict, **measured) -> dict:
    """A record: provenance first, then the figures (``metrics``: test/acc and test/acc5 as fractions)."""
    return {
        "recipe": recipe,
        **provenance(argv, "train", accelerator, devices),
        "test_top1": round(100 * float(metrics["test/acc"]), 2),
        "test_top5": round(100 * float(metrics["test/acc5"]), 2),
        **measured,
    }


def write(run: Path, record: dict, tested: str | None = None) -> Path:
    """Write ``results.json`` after fit, or ``results-<checkpoint>.json`` after a later test, and a dirty diff."""
    path = run / (FILE if tested is None else f"results-{tested}.json")
    write_whole(path, json.dumps(record, indent=2) + "\n")
    if record.get("dirty") and "diff" not in record:
        keep_diff(path, record)
        if "diff" in record:  # again, naming the diff
            write_whole(path, json.dumps(record, indent=2) + "\n")
    return path


def read(path: Path) -> dict:
    """A record; one that cannot be read (torn, not JSON, not a mapping) raises RunError naming the file."""
    from vit.exits import RunError

    try:
        record = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunError(f"{path}: not a readable record ({e}): run it again or remove the file") from None
    if not isinstance(record, dict):
        raise RunError(f"{path}: not a record (a JSON mapping): run it again or remove the file")
    return record


def record_run(trainer, module, mode: str, argv: list[str], ckpt: str | None, metrics: dict,
               tested_checkpoint: dict | None, configuration: dict | None = None) -> Path:
    """Write the record to the run folder and the W&B summary. After fit it describes the run and keeps its
    effective ``configuration`` (which plans compare against); after test, the tested checkpoint's run."""
    import torch

    from vit import configs
    from vit.training import guards
    from vit.models.checkpoints import clock_state
    from vit.training.callbacks import TimeToAccuracy, TrainingClock
    from vit.training.loggers import wandb_logger

    run = Path(trainer.default_root_dir)
    if mode == "fit":
        clock = next(cb for cb in trainer.callbacks if isinstance(cb, TrainingClock)).state_dict()
        recipe = configs.recipe_name(argv)
    else:
        clock = clock_state(tested_checkpoint) or {}
        recipe = Path(configs.named_recipes(argv)[-1]).stem if configs.named_recipes(argv) else run.parent.name
    best = module.val_acc_best.max_value  # restored with the tested checkpoint's state
    timer = next((cb for cb in trainer.callbacks if isinstance(cb, TimeToAccuracy)), None)
    reached, reached_wall = (timer.reached, timer.reached_wall) if timer is not None else (None, None)
    record = make(
        recipe=recipe, argv=[mode, *argv] if mode == "test" else argv,
        # not the module's device: Lightning's teardown has moved it to the CPU by now
        accelerator=trainer.strategy.root_device.type, devices=trainer.world_size, metrics=metrics,
        test_images=module.tested_images,
        checkpoint=ckpt and os.path.relpath(ckpt, run), best_val_acc=round(100 * best.item(), 2) if torch.isfinite(best) else None,
        epochs=clock.get("epochs"), steps=clock.get("steps"), training_seconds=clock.get("training_seconds"),
        # fit: all the run's commands; test: this one
        wall_seconds=clock.get("wall_seconds") if mode == "fit" else round(guards.wall_seconds(), 1),
        train_images_per_second=clock.get("train_images_per_second"),
        # first batches: torch.compile's time, included in training_seconds
        commands=clock.get("commands"), first_batches_seconds=clock.get("first_batches_seconds"),
        validation_seconds=clock.get("validation_seconds"),
        # training epochs' seconds alone, and wall seconds
        **({"time_to_val_acc": {f"{t:.2f}": round(s, 1) for t, s in reached.items()},
            "time_to_val_acc_wall": {f"{t:.2f}": round(s, 1) for t, s in reached_wall.items()}}
           if reached is not None else {}),
        **({"other_code": other} if (other := other_code(clock)) else {}),
        **({"configuration": configuration} if configuration is not None else {}))
    path = write(run, record, None if mode == "fit" else Path(ckpt).stem)
    wandb = wandb_logger(trainer.loggers)
    if wandb is not None:  # configuration: in the W&B config already
        wandb.experiment.summary.update({k: v for k, v in record.items() if k != "configuration"})
    return path


def differences(record: dict, configuration: dict) -> list[str]:
    """How a record's run differs from ``configuration``, as ``option recorded → planned``; [] when it is that run.
    A record without a configuration (older) cannot be matched."""
    recorded = record.get("configuration")
    if not isinstance(recorded, dict):
        return ["configuration: not recorded"]
    return changes(recorded, configuration)


def today(value):
    """``value`` with class paths of moved modules (vit.MOVED) rewritten as today's, so old records still match."""
    from vit import MOVED

    if isinstance(value, dict):
        return {k: today(v) for k, v in value.items()}
    if isinstance(value, list):
        return [today(v) for v in value]
    if isinstance(value, str) and value.startswith("vit."):
        module, _, name = value.rpartition(".")
        return f"{MOVED[module]}.{name}" if module in MOVED else value
    return value


def changes(recorded: dict, planned: dict) -> list[str]:
    """Keys whose values differ, as ``key recorded → planned`` ("(none)" if absent), class paths as of today."""
    missing = object()
    recorded, planned = today(recorded), today(planned)
    return [f"{k} {recorded.get(k, '(none)')} → {planned.get(k, '(none)')}"
            for k in sorted(set(recorded) | set(planned)) if recorded.get(k, missing) != planned.get(k, missing)]
