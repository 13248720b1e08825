"""`make wheels`: every package that `make install` takes, as wheels for another machine (its Python version
and platform), into one folder from which that machine installs with no index (`make install WHEELS=DIR`).

pip resolves the project for the target (`pip install --dry-run --report`, its documented JSON report), then
downloads exactly that list, binary wheels only. --without-torch leaves torch, torchvision and whatever only
they need (CUDA's libraries, triton) out: the target's environment provides them (`SYSTEM_SITE=1`).
--torch-index URL (`make wheels TORCH=BUILD`) takes torch and torchvision from that index alone (PyTorch's
for the build; the constraints pin the build's local version, scripts/torch_build.py), downloaded first,
then resolves everything else from the usual index with those two as found in the folder."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEPT_BY_THE_ENVIRONMENT = {"torch", "torchvision"}
PROJECT = "vit-lightning"


# This runs before any venv exists, with whatever python3 a login node has: the standard library only
# (packaging's canonicalize_name and Requirement(...).name, as PEP 503 and PEP 508 define them).
def canonicalize_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(text: str) -> str | None:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", text)
    return canonicalize_name(match.group(1)) if match else None


def pip(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", *args])
    if proc.returncode:
        sys.exit(proc.returncode)


def resolve(target: list[str], extras: str, constraints: list[str]) -> list[dict]:
    """pip's report of what an install of the project (with ``extras``) takes on the target."""
    project = f"{ROOT}[{extras}]" if extras else str(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        pip("install", "--dry-run", "--quiet", "--ignore-installed", "--target", str(Path(tmp) / "target"),
            *target, "--report", str(report), *constraints, project, "setuptools>=77")
        return json.loads(report.read_text())["install"]


def needed_without(items: list[dict], left_out: set[str]) -> list[dict]:
    """``items`` less ``left_out`` and every package that only those need (any requirement between two
    packages counts, whatever its marker: what is kept is never too little)."""
    requirers: dict[str, set[str]] = {}
    for item in items:
        name = canonicalize_name(item["metadata"]["name"])
        for text in item["metadata"].get("requires_dist") or []:
            if required := requirement_name(text):
                requirers.setdefault(required, set()).add(name)
    names = {canonicalize_name(i["metadata"]["name"]) for i in items}
    roots = {canonicalize_name(PROJECT), "setuptools"}
    gone = set(left_out)
    while True:  # a package goes when every package that needs it is gone, and the project does not need it
        more = {n for n in names - gone - roots if requirers.get(n) and requirers[n] <= gone}
        if not more:
            break
        gone |= more
    return [i for i in items if canonicalize_name(i["metadata"]["name"]) not in gone]


def platforms(tag: str) -> list[str]:
    """``tag`` and the older manylinux tags a machine of that tag runs (pip expands them only in some
    versions): manylinux_2_28_x86_64 → manylinux_2_28_x86_64, ..._2_27_..., ..., manylinux_2_17_x86_64,
    manylinux2014_x86_64."""
    match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", tag)
    if not match:
        return [tag]
    glibc, arch = int(match.group(1)), match.group(2)
    return [*(f"manylinux_2_{v}_{arch}" for v in range(glibc, 16, -1)), f"manylinux2014_{arch}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make wheels", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, required=True, help="the folder to fill")
    parser.add_argument("--python-version", required=True, help="the target's Python, e.g. 3.11")
    parser.add_argument("--platform", required=True, help="the target's platform tag, e.g. "
                                                          "manylinux_2_28_x86_64 (older manylinux tags count too)")
    parser.add_argument("--extras", default="", help="optional parts, as in make install EXTRAS=demo,onnx")
    parser.add_argument("--without-torch", action="store_true",
                        help="leave torch, torchvision and their CUDA stack out (the target's are kept)")
    parser.add_argument("--torch-index", help="the index torch and torchvision come from (PyTorch's for a build)")
    parser.add_argument("-c", "--constraint", action="append", default=[], help="pip's constraints file")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"3\.\d+", args.python_version):
        parser.error(f"--python-version {args.python_version}: give MAJOR.MINOR, e.g. 3.11")
    target = ["--only-binary=:all:", "--python-version", args.python_version,
              *(f"--platform={tag}" for tag in platforms(args.platform))]
    if args.torch_index and args.without_torch:
        parser.error("--torch-index takes torch, --without-torch leaves it out: give one")
    constraints = [f"--constraint={c}" for c in args.constraint]
    if args.torch_index:  # only torch and torchvision from that index; the resolver then finds them in the folder
        pip("download", "--quiet", "--no-deps", *target, "--index-url", args.torch_index, "--dest", str(args.dest),
            *constraints, *sorted(KEPT_BY_THE_ENVIRONMENT))
        constraints += ["--find-links", str(args.dest)]
    items = resolve(target, args.extras, constraints)
    left_out = KEPT_BY_THE_ENVIRONMENT if args.without_torch else set()
    fetched = KEPT_BY_THE_ENVIRONMENT if args.torch_index else set()
    wanted = [i for i in needed_without(items, left_out)
              if canonicalize_name(i["metadata"]["name"]) not in {PROJECT, *fetched}]
    with tempfile.TemporaryDirectory() as tmp:
        pins = Path(tmp) / "requirements.txt"
        pins.write_text("".join(f"{i['metadata']['name']}=={i['metadata']['version']}\n" for i in wanted))
        pip("download", "--quiet", "--no-deps", *target, "--dest", str(args.dest), "-r", str(pins))
    print(f"{len(wanted) + len(fetched)} packages for Python {args.python_version} on {args.platform} in {args.dest}"
          + (" (torch and torchvision left out: the environment's are kept)" if args.without_torch else "")
          + (f" (torch and torchvision from {args.torch_index})" if args.torch_index else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
