"""Private names of other libraries are a last resort, each listed with its reason (vit.private_api): the scan
sees attributes read, private attributes of a library class our subclass assigns or reads, our overrides of a
library method outside its documented surfaces, Lightning's loop internals and private modules named in strings."""

import ast
from pathlib import Path

from vit.private_api import PRIVATE_USES

ROOT = Path(__file__).resolve().parents[1]


STDLIB_PUBLIC = {"_exit"}  # os._exit: documented public API of Python's os module, despite its underscore


def private_uses() -> set[tuple[str, str]]:
    """(file, name) of every ``._name`` this package reads that it does not define itself, and every global of
    another library's module that it assigns."""
    files = sorted(f for f in (ROOT / "vit").rglob("*.py") if f.name != "private_api.py")
    trees = {f.relative_to(ROOT).as_posix(): ast.parse(f.read_text()) for f in files}
    ours = {n.name for t in trees.values() for n in ast.walk(t) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    ours |= {n.attr for t in trees.values() for n in ast.walk(t)
             if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
    ours |= {n.id for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.Name)}
    found = set()
    for name, tree in trees.items():
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__") \
                    and n.attr not in ours and n.attr not in STDLIB_PUBLIC:
                found.add((name, n.attr))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr" \
                    and isinstance(n.args[1], ast.Constant) and str(n.args[1].value).startswith("_"):
                found.add((name, n.args[1].value))
            if isinstance(n, ast.ImportFrom) and n.module and ".overrides" in n.module:
                found.add((name, n.module))
        # a library module's global that we replace (`import timm.optim.muon as m; m.f = ...`)
        modules = {a.asname or a.name: a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
                   if not a.name.startswith("vit")}
        for n in ast.walk(tree):
            if isinstance(n, ast.Assign):
                for target in n.targets:
                    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                            and target.value.id in modules:
                        found.add((name, f"{modules[target.value.id]}.{target.attr}"))
    return found


# Lightning's loops are internals (its docs: "the loop API is experimental"): reading their state is listed
LOOP_INTERNALS = {"fit_loop", "epoch_loop", "batch_progress", "setup_data"}
# the surfaces libraries document for overriding: a method of ours that overrides one of another class is listed
PUBLIC_SURFACES = ("lightning.pytorch.callbacks.Callback", "lightning.pytorch.LightningModule",
                   "lightning.pytorch.LightningDataModule", "lightning.pytorch.cli.LightningCLI",
                   "lightning.pytorch.loggers.Logger", "lightning.pytorch.loggers.CSVLogger",
                   "lightning.pytorch.loggers.WandbLogger", "lightning.pytorch.cli.SaveConfigCallback",
                   "lightning.pytorch.callbacks.ProgressBar", "lightning.fabric.plugins.io.CheckpointIO",
                   "torchvision.datasets.DatasetFolder", "pickle.Unpickler",
                   "torch.nn.Module", "torch.utils.data.Dataset", "torch.utils.data.Sampler", "logging.Filter",
                   "argparse.HelpFormatter", "jsonargparse.ActionConfigFile", "pickle._Pickler",
                   "torchmetrics.Metric")  # (its documented way to implement a metric: update, compute, full_state_update)


def _resolve(dotted: str):
    import importlib

    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def hidden_uses() -> set[tuple[str, str]]:
    """What the attribute scan cannot see: private attributes of a library class that our subclass assigns or
    reads as ``self._x``, our overrides of a library method outside its documented surfaces, Lightning's
    loop internals, and private modules named in strings (``numpy._core``)."""
    import importlib
    import inspect
    import re

    surfaces = {name for dotted in PUBLIC_SURFACES for name in dir(_resolve(dotted))}
    found = set()
    for path in sorted(f for f in (ROOT / "vit").rglob("*.py") if f.name != "private_api.py"):
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text())
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and n.attr in LOOP_INTERNALS:
                found.add((rel, n.attr))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"\w+(\.\w+)*\._\w+(\.\w+)*", n.value):
                found.add((rel, n.value))
        module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"))
        for cls in [c for c in vars(module).values() if inspect.isclass(c) and c.__module__ == module.__name__]:
            theirs = [b for b in cls.__mro__[1:] if not b.__module__.startswith("vit") and b is not object]
            for name in vars(cls):
                base = next((b for b in theirs if name in vars(b)), None)
                if base is not None and not (name.startswith("__") and name.endswith("__")) and name not in surfaces:
                    found.add((rel, f"{base.__name__}.{name}"))
            source = inspect.getsource(cls)
            for attr in set(re.findall(r"self\.(_[a-z]\w*)", source)):
                if any(f"self.{attr}" in _source(b) for b in theirs):
                    found.add((rel, attr))
    return found


def _source(cls) -> str:
    import inspect

    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):  # a class defined in C
        return ""


def test_every_private_use_is_listed_with_its_reason():
    found = private_uses() | hidden_uses()
    unlisted = {(where, name) for where, name in found  # listed as the entry's name, or named in its reason
                if not any(w == where and (name in what or what in name or name.split(".")[-1] in why)
                           for w, what, why in PRIVATE_USES)}
    assert not unlisted, f"private names used without a reason in vit/private_api.py: {sorted(unlisted)}"
    for where, what, why in PRIVATE_USES:
        text = (ROOT / where).read_text()
        assert all(part in text for part in what.split(".")), f"{where} no longer uses {what}: remove it from the list"
        assert len(why) > 40


def test_the_libraries_are_bounded_to_the_tested_major_versions():
    text = (ROOT / "pyproject.toml").read_text()
    import re

    for name, major in (("lightning", 3), ("timm", 2), ("wandb", 1)):  # (lower bounds: make test-lowest)
        assert re.search(rf'"{name}>=[\d.]+,<{major}"', text), name
