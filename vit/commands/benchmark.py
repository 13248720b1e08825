"""`vit-benchmark` / `python scripts/benchmark.py`: speed figures for README, measured on the device
present. Example: `vit-benchmark --output benchmark.json`."""

from __future__ import annotations

import argparse
import sys

from vit.exits import ConfigError
from vit.failures import exit_on_failure


def batch_sizes(text: str) -> list[int]:
    """Comma-separated positive batch sizes."""
    sizes = [int(size) for size in text.split(",")]
    if min(sizes) < 1:
        raise ValueError(text)
    return sizes


parser = argparse.ArgumentParser(prog="vit-benchmark", description=__doc__)
parser.add_argument("--presets", nargs="+", default=["vit_tiny", "vit_small"])
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--steps", type=int, default=3, help="steps per timed round")
parser.add_argument("--rounds", type=int, default=7, help="alternating rounds; the median is reported")
parser.add_argument("--device", default="auto", help="cpu, cuda or auto")
parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
parser.add_argument("--output", help="write the results as JSON here")
parser.add_argument("--sections", default="model,data,step,checkpoint,classify,startup",
                    help="comma-separated: model (ours vs timm), data (data path), step (whole training step, beside the matmul peak), peak (the matmul peak alone), "
                         "checkpoint (the step checkpoint's cost), classify (throughput with decoding workers), "
                         "startup (classify start-up time), fast-paths (the cpu recipe's model in fp32, bf16 "
                         "autocast, compiled, and Muon's Newton–Schulz in float32 and bfloat16; not a default), "
                         "folders (an image-folder run's start on 2 processes, first and requeued, to its first "
                         "optimizer step; not a default), breakdown (where a training step of the default recipe's "
                         "model goes: data, model, optimizer and the rest, launches and host syncs, eager and "
                         "compiled; not a default)")
parser.add_argument("--workers", type=int, default=2, help="DataLoader workers for the data-path and classify comparisons")
parser.add_argument("--classify-images", type=int, default=2000, help="generated images for the classify section")
parser.add_argument("--data-images", type=int, default=20000)
parser.add_argument("--folder-images", type=int, default=100_000, help="generated JPEGs for the folders section")
parser.add_argument("--data-batch-size", type=int, default=256)
parser.add_argument("--step-batch-size", type=int, default=64)
parser.add_argument("--breakdown-batch-sizes", type=batch_sizes, default="512,1024",
                    help="comma-separated batch sizes of the breakdown section")
parser.add_argument("--breakdown-modes", default="eager,compiled",
                    help="comma-separated, of the breakdown section: eager, compiled (torch.compile, dynamic=False: "
                         "the model and Muon's step)")
parser.add_argument("--breakdown-steps", type=int, default=20,
                    help="steady steps the breakdown section times, and as many again that it profiles")
parser.add_argument("--compile", action="store_true", help="torch.compile the models (ours and timm's) and the whole step")
parser.add_argument("--startup-repeats", type=int, default=5)
parser.add_argument("--quick", action="store_true", help="one tiny round of everything (for tests)")
parser.add_argument("--minutes", type=float, default=None,
                    help="end this command within this many minutes: a section still running then is cut short, "
                         "--output lists it and the rest as pending, and the command exits 4; the same command "
                         "again measures those (for a job whose time is bounded)")



@exit_on_failure
def main(argv: list[str] | None = None) -> int:
    from vit.benchmark.runner import run

    args = parser.parse_args(argv)
    from vit.training.commits import commit

    commit()  # the code that runs, before anyone edits the tree
    args.argv = sys.argv[1:] if argv is None else argv  # for the record
    if args.minutes is not None and (args.minutes <= 0 or not args.output):
        raise ConfigError("--minutes takes a positive number of minutes, and --output (where the sections done are "
                          "kept)")
    run(args)
    return 0
