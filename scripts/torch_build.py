"""The constraints of a chosen torch build (`make install TORCH=cu126`, `make wheels TORCH=cu126`):
constraints.txt with torch and torchvision pinned to that build's local version (torch==2.14.1+cu126, which
only PyTorch's index for the build has) and without its CUDA libraries (nvidia-*, cuda-*: those of the
default build, CUDA 13), since each build of torch pins its own CUDA libraries exactly.

    python3 scripts/torch_build.py cu126 constraints.txt > constraints-cu126.txt

It runs before any venv exists, with whatever python3 a login node has: the standard library only."""

from __future__ import annotations

import re
import sys
from pathlib import Path

BUILT = ("torch", "torchvision")  # the packages PyTorch's index gives, of the build's local version
CUDA_LIBRARIES = re.compile(r"(nvidia|cuda)[-_.]", re.IGNORECASE)  # a build's own: left to torch's pins
BUILD = re.compile(r"cpu|cu\d+|rocm[\d.]+")


def constraints_for(build: str, text: str) -> str:
    """``text`` (a constraints file) for torch built as ``build``."""
    if not BUILD.fullmatch(build):
        raise ValueError(f"TORCH={build}: give one of PyTorch's builds, e.g. cu126, cu128, cu130 or cpu "
                         "(CUDA 12.6, 12.8, 13.0, or the CPU)")
    lines = [f"# constraints.txt for torch built as {build} (scripts/torch_build.py writes it)"]
    for line in text.splitlines():
        name, _, version = line.partition("==")
        if CUDA_LIBRARIES.match(line) or line.startswith("#"):
            continue
        if name.strip().lower() in BUILT and version:
            line = f"{name.strip()}=={version.strip().split('+')[0]}+{build}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: torch_build.py BUILD CONSTRAINTS (e.g. cu126 constraints.txt)", file=sys.stderr)
        return 2
    try:
        sys.stdout.write(constraints_for(argv[0], Path(argv[1]).read_text()))
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
