"""A plan's table (``vit-plan table``): one row per change, the mean and spread over its seeds of the figures
its runs' records hold."""

from __future__ import annotations

import re
import shlex
import statistics
from pathlib import Path

from vit.training import results
from vit.plans.plan_file import Plan, Run


def _spread(values: list[float | None], digits: int = 2) -> str:
    """mean ± standard deviation of the values a record has (a non-finite one is written null: left out, and
    the count of those left says so)."""
    missing = sum(v is None for v in values)
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    if missing:
        return f"{_spread(values, digits)} (n={len(values)})"
    mean = f"{statistics.fmean(values):,.{digits}f}"
    return f"{mean} ± {statistics.stdev(values):,.{digits}f}" if len(values) > 1 else mean


def summary(plan: Plan, runner) -> str:
    """The plan's training runs as one row per change: n (the seeds with a record of the run the plan has now,
    of those planned) and the mean ± standard deviation over them of test top-1, best validation accuracy,
    epochs and images/s; ``runner.record_path(run)`` is the record's path. A record of another command (the plan
    changed since it ran: ``runner.differences``) is left out, and a line under the table says which and why. A row
    with a record made from uncommitted changes is marked † after its n, one of a run resumed on other code §,
    with the pages' footnotes (where the diff is; which code) under the table."""
    from vit.reporting.tables import DIRTY, OTHER_CODE, UNKNOWN, Notes

    changes: dict[str, list[Run]] = {}
    other: dict[str, list[str]] = {}  # the runs whose record is another command's: what differs
    for job in plan.runs:
        if isinstance(job, Run):
            changes.setdefault(job.change, []).append(job)
            if differ := runner.differences(job):
                other[job.name] = differ

    def record_of(job):
        path = runner.record_path(job)
        return None if job.name in other else path
    head = ["run", "arguments", "n", "test top-1 (%)", "best val (%)", "epochs", "train img/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    notes = Notes(Path.cwd())
    for change, jobs in changes.items():
        paths = [record_of(job) for job in jobs if record_of(job) and record_of(job).is_file()]
        got = [results.read(path) for path in paths]
        marks = "".join(notes.made(path, r) for path, r in zip(paths, got))
        made = "".join(mark for mark in (DIRTY, UNKNOWN, OTHER_CODE) if mark in marks)
        label = re.sub(r", seed \d+$", "", jobs[0].label)
        own = f"`{shlex.join(jobs[0].own)}`" if jobs[0].own else "the plan's"
        cells = [label, own + (f" (commit {jobs[0].commit})" if jobs[0].commit else ""),
                 f"{len(got)} of {len(jobs)}{made}"]
        if got:
            cells += [_spread([r.get("test_top1") for r in got]), _spread([r.get("best_val_acc") for r in got]),
                      _spread([r.get("epochs") for r in got], 1),
                      _spread([r.get("train_images_per_second") for r in got], 0)]
        else:
            cells += ["pending"] * 4
        lines.append("| " + " | ".join(cells) + " |")
    if other:
        first, differ = next(iter(other.items()))
        lines.append(f"\n{len(other)} record(s) left out, of another command than the plan's run now "
                     f"({', '.join(other)}; {first}: {'; '.join(differ[:3])}{'; ...' if len(differ) > 3 else ''}): "
                     "`vit-plan run` or `submit` moves them aside and runs them again")
    return "\n".join(lines + notes.lines()) + "\n"
