"""Print pyproject.toml's direct dependencies (the package's and every extra's) pinned at their lower bounds,
one requirement a line, for `make test-lowest`: `python scripts/lowest_versions.py [NAME==VERSION ...]`.
A NAME==VERSION argument replaces that package's pin (make test-lowest's torch and torchvision: LOWEST_TORCH)."""

import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def lowest(pyproject: Path, overrides: dict[str, str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = [*project["dependencies"], *(r for extra in project.get("optional-dependencies", {}).values()
                                                  for r in extra)]
    pins = []
    for text in requirements:
        req = Requirement(text)
        if req.name == project["name"]:  # an extra naming others (dev = [..., "vit-lightning[onnx,demo]"])
            continue
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        if req.name in overrides:
            pins.append(f"{req.name}{extras}=={overrides.pop(req.name)}")
            continue
        floors = [s.version for s in req.specifier if s.operator in (">=", "==", "~=")]
        if len(floors) != 1:
            sys.exit(f"{pyproject}: {text!r} has no single lower bound (>=) to install")
        pins.append(f"{req.name}{extras}=={floors[0]}")
    if overrides:
        sys.exit(f"not a direct dependency in {pyproject}: {', '.join(overrides)}")
    return pins


if __name__ == "__main__":
    given = dict(arg.split("==", 1) for arg in sys.argv[1:])
    print("\n".join(lowest(ROOT / "pyproject.toml", given)))
