"""Private names of other libraries are a last resort, each listed with its reason (vit.private_api)."""

import ast
from pathlib import Path

from vit.private_api import PRIVATE_USES

ROOT = Path(__file__).resolve().parents[1]


def private_uses() -> set[tuple[str, str]]:
    """(file, name) of every ``._name`` this package reads that it does not define itself."""
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
                    and n.attr not in ours:
                found.add((name, n.attr))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr" \
                    and isinstance(n.args[1], ast.Constant) and str(n.args[1].value).startswith("_"):
                found.add((name, n.args[1].value))
            if isinstance(n, ast.ImportFrom) and n.module and ".overrides" in n.module:
                found.add((name, n.module))
    return found


def test_every_private_use_is_listed_with_its_reason():
    found = private_uses()
    unlisted = {(where, name) for where, name in found  # listed as the entry's name, or named in its reason
                if not any(w == where and (name == what or what in name or name in why) for w, what, why in PRIVATE_USES)}
    assert not unlisted, f"private names used without a reason in vit/private_api.py: {sorted(unlisted)}"
    for where, what, why in PRIVATE_USES:
        assert what in (ROOT / where).read_text(), f"{where} no longer uses {what}: remove it from the list"
        assert len(why) > 40


def test_the_libraries_are_bounded_to_the_tested_major_versions():
    text = (ROOT / "pyproject.toml").read_text()
    for bound in ('"lightning>=2.4,<3"', '"timm>=1.0.9,<2"', '"wandb>=0.18,<1"'):
        assert bound in text
