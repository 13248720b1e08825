"""Speed figures for README, measured on the device present. Example:

    python scripts/benchmark.py --output benchmark.json
"""

import argparse

from vit.benchmark import run

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--presets", nargs="+", default=["vit_tiny", "vit_small"])
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--steps", type=int, default=3, help="steps per timed round")
parser.add_argument("--rounds", type=int, default=7, help="alternating rounds; the median is reported")
parser.add_argument("--device", default="auto", help="cpu, cuda or auto")
parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
parser.add_argument("--output", help="write the results as JSON here")
parser.add_argument("--quick", action="store_true", help="one tiny round of everything (for tests)")

if __name__ == "__main__":
    run(parser.parse_args())
