"""The benchmark's report: its JSON file and the tables printed as each section ends."""

from __future__ import annotations

import json
from pathlib import Path


def format_table(rows: list[dict], columns: list[str]) -> str:
    def fmt(v):
        if not isinstance(v, float):
            return str(v)
        return f"{v:.3g}" if abs(v) < 1 else (f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}")

    cells = [columns] + [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_report(report: dict, output: str | None) -> None:
    """The report as JSON at ``output`` (from a tree with uncommitted changes, their diff beside it)."""
    if output:
        from vit.training.results import keep_diff, write_whole

        keep_diff(Path(output), report)
        write_whole(Path(output), json.dumps(report, indent=2) + "\n")  # (a run killed mid-write tears nothing)
