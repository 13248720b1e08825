"""The recipes, installed with the package as ``vit.configs`` (package data), so that a recipe is found
by name from any directory: ``vit-train --config smoke``."""

from __future__ import annotations

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
