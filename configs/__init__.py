"""The recipes, installed with the package as ``vit.configs`` (package data), so that a recipe is found
by name from any directory: ``vit-train --config smoke``."""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

BASE = "base"  # trainer, loggers, checkpoints: what every recipe shares
DEFAULT = "vit_cifar10"  # the recipe that runs when none is named
CPU = "cpu"  # ... and when none is named on a machine without a GPU


def names() -> list[str]:
    """Every recipe a user can name (the base is not one)."""
    return sorted(p.name.removesuffix(".yaml") for p in files(__name__).iterdir()
                  if p.name.endswith(".yaml") and p.name != f"{BASE}.yaml")


def path(name: str) -> Path:
    """A recipe's YAML file: ``name`` is a recipe name or a path to any YAML file."""
    if Path(name).is_file():
        return Path(name)
    found = Path(str(files(__name__) / f"{name.removesuffix('.yaml')}.yaml"))
    if not found.is_file():
        from vit.exits import ConfigError

        raise ConfigError(f"--config {name}: neither a file nor a recipe name ({', '.join(names())})")
    return found


def is_settings(value: str) -> bool:
    """A --config value that holds settings rather than naming a recipe: a mapping written out
    ('{"model.optimizer.lr": 0.001}', W&B's sweep agent's ${args_json}) or a JSON file (its ${args_json_file})."""
    return value.lstrip().startswith("{") or value.endswith(".json")


def named_recipes(argv: list[str]) -> list[str]:
    """The recipes the command line names with --config, in order (settings given to --config name none)."""
    given = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--config", "-c")] + \
        [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    return [value for value in given if not is_settings(value)]


def recipe_name(argv: list[str]) -> str:
    """The last recipe named on the command line (it names the run root), else the default's."""
    named = named_recipes(argv)
    return Path(named[-1]).name.removesuffix(".yaml") if named else DEFAULT if gpu_present() else CPU


def gpu_present() -> bool:
    import torch

    return torch.cuda.is_available() or os.environ.get("VIT_ASSUME_GPU") == "1"


def default_files(mode: str, argv: list[str], note: bool = True) -> list[Path]:
    """The YAML files vit-train reads before the command line: the base, the default recipe, and without a
    GPU (and without a recipe named) the CPU recipe, which one line announces (``note``); with --help, the
    recipes named on the line too, so that --help shows their defaults."""
    defaults = [path(BASE), path(DEFAULT)]
    if mode == "fit" and not named_recipes(argv) and not gpu_present():
        from lightning.pytorch.utilities import rank_zero_info

        from vit.cluster import gpus

        gpus.check_gpus_usable()  # GPUs given but unusable: never the CPU recipe in their place
        defaults.append(path(CPU))
        if note:
            rank_zero_info(f"no GPU here: the default recipe {DEFAULT} is a GPU recipe (100 epochs, bf16), so "
                           f"this runs the {CPU} recipe (10 minutes); name a recipe with --config to choose. On a "
                           f"cluster's login node, train on a GPU node instead: sbatch scripts/slurm/train.sbatch")
    if {"-h", "--help"} & set(argv):
        defaults += [path(name) for name in named_recipes(argv)]
    return defaults
