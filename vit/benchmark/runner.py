"""The sections asked, in order, into one report: each section's own module measures it, ``time_bound``
cuts it short at ``--minutes``, ``report`` writes the report."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from vit.benchmark import breakdown, checkpoint, classify, data, fast_paths, folders, model, peak, startup, step
from vit.benchmark.report import write_report
from vit.benchmark.common import BenchmarkError
from vit.benchmark.time_bound import TimeBound, time_bound
from vit.exits import Stopped

MODULES = {"model": model, "data": data, "peak": peak, "step": step, "fast-paths": fast_paths, "classify": classify,
           "checkpoint": checkpoint, "startup": startup,
           "folders": folders, "breakdown": breakdown}
SECTIONS = tuple(MODULES)


def section(name: str, report: dict, args, device: torch.device, dtype: torch.dtype) -> None:
    """Measure one section into ``report`` and print its table."""
    MODULES[name].section(report, args, device, dtype)


def run(args) -> dict:
    """The sections asked, in order, into one report (written to --output after each). With --minutes, a
    section still running at the bound is cut short and the report lists it and the rest under
    ``sections_pending`` (StoppedEarly, exit 4: a time bound that runs out is a stop, never an error); the same
    command again measures only those and completes the report, unless the first it measured was cut (then the
    line says to raise --minutes). The report's provenance is its first command's."""
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[
        args.dtype if args.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")]
    from vit.training.results import provenance

    deadline = time.monotonic() + 60 * args.minutes if args.minutes else None
    report = {**provenance(list(args.argv), "benchmark", device.type, 1), "torch": torch.__version__}
    todo = args.sections.split(",")
    unknown = [name for name in todo if name not in SECTIONS]
    if unknown:
        raise BenchmarkError(f"--sections: no section {', '.join(unknown)} (there are {', '.join(SECTIONS)})")
    if args.output and Path(args.output).is_file():
        earlier = json.loads(Path(args.output).read_text())
        if earlier.get("sections_pending"):  # a bounded benchmark's earlier command: go on with what remains
            report, todo = earlier, earlier["sections_pending"]
            print(f"continuing {args.output}: sections {', '.join(todo)}")
    for i, name in enumerate(todo):
        report["sections_pending"] = todo[i:]
        try:
            with time_bound(deadline):
                section(name, report, args, device, dtype)
        except TimeBound:
            write_report(report, args.output)
            if i == 0:  # (the same command would stop here again)
                raise StoppedEarly(f"--minutes {args.minutes:g} ran out in section {name}, the first this command "
                                   f"measured, which alone takes longer: raise --minutes, or measure fewer rounds "
                                   f"or presets") from None
            raise StoppedEarly(f"--minutes {args.minutes:g} ran out in section {name}: sections "
                               f"{', '.join(todo[i:])} remain. Run the same command again to measure them "
                               f"({args.output} keeps the sections done)") from None
        report["sections_pending"] = todo[i + 1:]
        write_report(report, args.output)
    report.pop("sections_pending")
    write_report(report, args.output)
    if args.output:
        print(f"wrote {args.output}")
    return report


class StoppedEarly(Stopped):
    """--minutes ran out; the report says which sections remain (exit 4)."""
