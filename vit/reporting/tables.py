"""Tables rendered from records: the figures blocks of README and docs/ (``<!-- figures: TABLE -->`` …
``<!-- /figures -->``, one row per run of the plan that fills TABLE, "pending" where no record satisfies it: ``satisfying``).
A plan's own summary over its seeds (``vit-plan table``) is vit/reporting/plan_table.py."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from vit.training import results
from vit.models.checkpoints import todays_words
from vit.exits import ConfigError
from vit.plans import PLACING, RENAMED_SECTIONS, REPO, Benchmark, Plan, Run, load_all

BLOCK = re.compile(r"(<!-- figures: (?P<table>[\w-]+) -->\n)(?P<body>.*?)(<!-- /figures -->)", re.S)


def jobs_of(table: str, plans: list[Plan]) -> list[Run | Benchmark]:
    """The table's rows, in its plan's order."""
    return [job for plan in plans for job in plan.runs if job.table == table]


def benchmark_command(command: str) -> str:
    """A benchmark record's shown command, with each section under its name today."""
    words = shlex.split(shown_command(command))
    for i in range(1, len(words)):
        if words[i - 1] == "--sections":
            words[i] = ",".join(RENAMED_SECTIONS.get(name, name) for name in words[i].split(","))
    return shlex.join(["scripts/benchmark.py", *words])


def _shown_words(command: str) -> tuple[list[str], list[str]]:
    """The recorded command's words under today's option names (vit.models.checkpoints.todays_words, the mapping
    checkpoints are read with) without what only places files (data root, run folder, chunking); and the
    options it set that this version no longer has."""
    words, shown, skip = shlex.split(command), [], False
    for word in words[2 if words[:1] == ["python"] else 1:]:
        if skip:
            skip = False
        elif word in PLACING:
            skip = True
        else:
            shown.append(word)
    return todays_words(shown)


def shown_command(command: str) -> str:
    """The recorded command as a user types it today (the record keeps the command as it ran)."""
    return shlex.join(_shown_words(command)[0])


def command_cell(command: str) -> str:
    """A row's command: today's command line, then the settings it ran with that no option says today."""
    today, gone = _shown_words(command)
    said = "not an option today" if len(gone) == 1 else "not options today"
    return f"`{shlex.join(today)}`" + (f" with {', '.join(gone)} ({said})" if gone else "")


def _device(r: dict) -> str:
    if r.get("device") != r.get("cpu"):
        versions = ", ".join(f"{label} {r[key]}" for key, label in (("cuda", "CUDA"), ("driver", "driver")) if r.get(key))
        return f"{r['device_count']}× {r['device']}" + (f" ({versions})" if versions else "")
    threads, units = r.get("torch_threads"), r.get("cpu_bf16")
    cpu = r["cpu"] + (f" ({', '.join(units)})" if units else " (no bf16 units)" if units == [] else "")
    return f"{cpu}, {threads} thread{'s' * (threads != 1)}" if threads else cpu


def _provenance(path: Path, r: dict, base: Path, notes: Notes) -> str:
    made = notes.made(path, r)  # (first: it checks the record's commit)
    commit = (r.get("commit") or "no commit")[:7]  # (the record says more: the machine's load)
    return f"[{path.stem}]({_link(path, base)}) `{commit}`{made} {r['date'][:10]}"


def _link(path: Path, base: Path) -> str:
    return Path(os.path.relpath(path, base)).as_posix()


# what the device cell shows: a correction of one of these is marked there, of any other field after the record
DEVICE_FIELDS = {"device", "device_count", "cuda", "driver", "cpu", "cpu_bf16", "torch_threads"}
DIRTY, CORRECTED, OTHER_CODE, UNKNOWN = "†", "‡", "§", "¶"


class Notes:
    """The marks of one table's records and their footnotes, one paragraph each under the table: † a record made
    from uncommitted changes (``dirty``; the diff beside it, ``results.keep_diff``, or not kept), ¶ one whose code
    state is not known (``dirty`` null: git could not tell, or no git), § a run that commands on other code
    trained too (``other_code``: resumed on another commit), ‡ fields filled in by hand from another record
    (``corrected``)."""

    def __init__(self, base: Path):
        self.base, self.dirty, self.unknown, self.other, self.corrected = base, {}, [], [], []

    def made(self, path: Path, r: dict) -> str:
        """The marks after a record's commit: † when uncommitted changes to it made the record, ¶ when whether
        they did is not known, § when commands on other code trained the run too. It checks the record's
        ``commit`` first (a string, or null)."""
        if not isinstance(r.get("commit"), (str, type(None))):
            raise ConfigError(f"{path}: commit: takes the commit's hash (a string), or null, got {r.get('commit')!r}")
        return self._dirty(path, r) + self._other(path, r)

    def _dirty(self, path: Path, r: dict) -> str:
        if "dirty" in r and r["dirty"] is None:  # (git could not tell; a record without the key predates it)
            self.unknown.append(f"[{path.stem}]({_link(path, self.base)})")
            return UNKNOWN
        if not r.get("dirty"):
            return ""
        if not isinstance(r.get("diff"), (str, type(None))):
            raise ConfigError(f"{path}: diff: takes the name of the file beside the record that holds its uncommitted "
                              f"changes (vit.training.results.keep_diff), got {r.get('diff')!r}")
        diff = path.parent / r["diff"] if r.get("diff") else None
        kept = diff is not None and diff.is_file()
        self.dirty.setdefault((r.get("commit") or "no commit")[:7], []).append(diff if kept else None)
        return DIRTY

    def _other(self, path: Path, r: dict) -> str:
        other = r.get("other_code")
        if not other:
            return ""
        if not (isinstance(other, list) and all(isinstance(o, dict) and isinstance(o.get("commands"), int)
                                                and isinstance(o.get("commit"), (str, type(None))) for o in other)):
            raise ConfigError(f"{path}: other_code: takes [{{\"commit\": ..., \"dirty\": ..., \"commands\": N}}, "
                              f"...] (vit.training.results.other_code), got {other!r}")

        def code(o: dict) -> str:
            if o["commit"] is None:
                return "a copy installed without git"
            if o["commit"] == "not known":
                return "code that its checkpoint does not tell"
            same = o["commit"] == r.get("commit")  # (then it differs from the record's in its changes)
            changes = ("" if o.get("dirty") is False and not same else
                       " without uncommitted changes" if o.get("dirty") is False else
                       " with other uncommitted changes" if same and r.get("dirty") else
                       " with uncommitted changes" if o.get("dirty") else
                       ", whether with uncommitted changes not known")
            return f"`{o['commit'][:7]}`{changes}"

        which = ", ".join(f"{code(o)} ({o['commands']} command{'s' if o['commands'] != 1 else ''})" for o in other)
        self.other.append(f"{OTHER_CODE} [{path.stem}]({_link(path, self.base)}): commands of other code than its "
                          f"record's commit trained the run: {which}.")
        return OTHER_CODE

    def filled(self, path: Path, r: dict, device: bool) -> str:
        """‡ after the device (``device``) or after the record, where the corrected fields are shown."""
        c = r.get("corrected")
        if c is None:
            return ""
        if not (isinstance(c, dict) and isinstance(c.get("fields"), list) and c["fields"]
                and isinstance(c.get("from"), str) and (path.parent / c["from"]).is_file()):
            raise ConfigError(f"{path}: corrected: takes {{\"fields\": [the fields filled in], \"from\": \"the record "
                              f"they come from, relative to this one's folder\", \"why\": \"...\"}}, got {c!r}")
        if device != bool(DEVICE_FIELDS & set(c["fields"])):
            return ""
        source = (path.parent / c["from"]).resolve()
        fields = ", ".join(f"`{f}`" for f in c["fields"])
        self.corrected.append(f"{CORRECTED} [{path.stem}]({_link(path, self.base)}): {fields} filled in by hand from "
                              f"the record [{source.parent.name}/{source.stem}]({_link(source, self.base)})"
                              + (f": {c['why']}" if c.get("why") else "") + ".")
        return CORRECTED

    def lines(self) -> list[str]:
        """The footnotes, each a paragraph of its own (a line right under a table would be one of its rows)."""
        out = []
        for commit, diffs in self.dirty.items():
            kept = [f"[{d.name}]({_link(d, self.base)})" for d in diffs if d is not None]
            where = ("the diff was not kept" if not kept else
                     f"the diff is beside the record: {kept[0]}" if len(diffs) == 1 else
                     f"the diffs are beside the records: {', '.join(kept)}"
                     + ("; the others' were not kept" if len(kept) < len(diffs) else ""))
            out.append(f"{DIRTY} made from uncommitted changes to `{commit}`; {where}.")
        if self.unknown:
            out.append(f"{UNKNOWN} code state unknown: whether uncommitted changes made {', '.join(self.unknown)} is "
                       "not known (git could not tell, or the code ran outside a git checkout).")
        out += self.other + self.corrected
        return [line for note in out for line in ("", note)]


def satisfying(table: str, results_dir: Path, plans: list[Plan], runner) -> dict[str, tuple[Path, dict]]:
    """The table's records that satisfy their rows, by row name: (path, record). A record satisfies its row when
    it is of the run the plan runs now (``runner.compare``, vit.plans.Runner's: the same configuration, or the
    same command for a benchmark or a run of another commit); any other row is pending, and the plan runs it
    again. A history plan's records are its rows as they were measured (it never runs)."""
    history = any(plan.history for plan in plans if table in plan.tables())
    found = {}
    for job in jobs_of(table, plans):
        path = results_dir / table / f"{job.name}.json"
        record = results.read(path) if path.is_file() else None
        if record is not None and (history or not runner.compare(job, record)):
            found[job.name] = (path, record)
    return found


def budget_note(r: dict) -> str:
    """After a row's label: that its budget stopped it (a plan's run with minutes: Runner.budget_record)."""
    b = r.get("budget")
    return f" (stopped at its {b['minutes']:.2g}-min budget)" if isinstance(b, dict) and b.get("stopped_by_budget") else ""


def render_runs(table: str, base: Path, plans: list[Plan], records: dict[str, tuple[Path, dict]]) -> str:
    jobs = jobs_of(table, plans)
    present = {name: r for name, (_, r) in records.items()}
    timed = any("time_to_val_acc" in r for r in present.values())
    head = ["run", "command", "device", "epochs", "training", "best val", "test top-1 (top-5)", "train img/s"]
    head += ["time to 90 / 93 / 94 %"] if timed else []
    lines = ["| " + " | ".join(head + ["record"]) + " |", "|" + " --- |" * (len(head) + 1)]
    notes = Notes(base)
    for job in jobs:
        r = present.get(job.name)
        if r is not None and "test_top1" not in r:  # killed at its budget before its record: none of its figures
            cells = [job.label + budget_note(r), f"`{shlex.join(job.args)}`"] + ["—"] * (len(head) - 2) \
                + [_provenance(records[job.name][0], r, base, notes)]
        elif r is None:
            cells = [job.label, f"`{shlex.join(job.args)}`"] + ["pending"] * (len(head) - 2) + ["—"]
        else:
            reached = r.get("time_to_val_acc", {})
            path = records[job.name][0]
            cells = [job.label + budget_note(r), command_cell(r['command']), _device(r) + notes.filled(path, r, True), f"{r['epochs']:g}",
                     f"{r['training_seconds'] / 60:.1f} min", f"{r['best_val_acc']:.2f} %" if r.get('best_val_acc') is not None else "— (not validated)",
                     f"**{r['test_top1']:.2f} %** ({r['test_top5']:.2f} %)", f"{r['train_images_per_second']:,.0f}"]
            if timed:  # the clock includes each command's first batches, where torch.compile compiles again
                compiles = f" (the clock includes the first batches of {r['commands']} command(s): " \
                    f"{r['first_batches_seconds']:.0f} s)" \
                    if r.get("commands") else ""
                wall = r.get("time_to_val_acc_wall", {})
                cells.append(" / ".join((f"{reached[t]:.0f} s" + (f" ({wall[t]:.0f} s wall)" if t in wall else ""))
                                        if t in reached else "—" for t in ("0.90", "0.93", "0.94")) + compiles)
            cells.append(_provenance(path, r, base, notes) + notes.filled(path, r, False))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + notes.lines()) + "\n"


def _bench_rows(r: dict) -> list[list[str]]:
    """(what, ours, reference, ratio, target) rows of one benchmark report."""
    r = {RENAMED_SECTIONS.get(key, key): value for key, value in r.items()}

    def n(x):
        return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"

    rows = []
    for m in r.get("model", []):
        what = f"{m['preset']}, batch {m['batch_size']}, {m['dtype']}" + (", compiled" if m.get("compiled") else "")
        for mode, name in (("train", "train step"), ("infer", "inference")):
            rows.append([f"{name}, {what} (img/s)", n(m[f"{mode}_img_s_ours"]), f"timm {n(m[f'{mode}_img_s_timm'])}",
                         f"**{m[f'{mode}_ratio']:.2f}**", "≥ 1.0"])
            if f"{mode}_peak_MiB_ours" in m:
                rows.append([f"{name} peak memory, {what} (MiB)", n(m[f"{mode}_peak_MiB_ours"]),
                             f"timm {n(m[f'{mode}_peak_MiB_timm'])}",
                             f"{m[f'{mode}_peak_MiB_ours'] / m[f'{mode}_peak_MiB_timm']:.2f}", "≤ 1.0"])
    for e in r.get("patch_embedding", []):
        rows.append([f"patch embedding E fwd+bwd, {e['preset']} (img/s)", f"{n(e['img_s_ours'])} (patchify + Linear)",
                     f"{n(e['img_s_conv'])} (timm strided conv)", f"**{e['ratio']:.2f}**", "≥ 1.0"])
    for d in r.get("data", []):
        rows.append(["data path: crop + flip + normalise (img/s)", f"{n(d['img_s_ours_device'])} (device path)",
                     f"{n(d['img_s_torchvision'])} (torchvision + PIL, DataLoader)",
                     f"**{d['ratio_device_vs_torchvision']:.1f}**", "≥ 5"])
        rows.append(["data path: vit's DataLoader workers (img/s)", n(d["img_s_ours_workers"]), n(d["img_s_torchvision"]),
                     f"{d['ratio_workers_vs_torchvision']:.2f}", "—"])
    for s in r.get("step", []):
        mfu = f", MFU {100 * s['mfu']:.1f} %" if s.get("mfu") else ""
        peak = r.get("peak") if "peak_fraction" in s else None  # (records before the matmul peak: no fraction)
        reference, fraction = (f"matmul peak {peak['tflops']:.3g} TFLOP/s ({peak['size']}², {peak['dtype']}, best of "
                               f"{peak['repeats']})", f"**{s['peak_fraction']:.2f}**") if peak else ("—", "—")
        rows.append([f"whole training step, {s['preset']}, batch {s['batch_size']}, {s['dtype']}"
                     + (", compiled" if s.get("compiled") else "") + " (img/s)",
                     f"{n(s['img_s'])} ({s['achieved_tflops']:.3g} TFLOP/s{mfu})", reference, fraction, "—"])
    for b in r.get("breakdown", []):
        if "skipped" in b:
            rows.append([f"where a training step goes, {b['mode']}", "—", b["skipped"], "—", "—"])
            continue
        rows.append([f"where a training step goes, {b['mode']}, batch {b['batch_size']}, {b['dtype']}: ms a step "
                     f"(data / model / optimizer / rest), kernel launches and host syncs a step",
                     f"{b['step_ms']:.1f} ({b['data_ms']:.1f} / {b['model_ms']:.1f} / {b['optimizer_ms']:.1f} / "
                     f"{b['rest_ms']:.1f}), {b['launches_per_step']:,.0f} launches, {b['host_syncs_per_step']:g} syncs",
                     f"{n(b['img_s'])} img/s ({b['achieved_tflops']:.3g} TFLOP/s)",
                     f"**{b['peak_fraction']:.2f}** of the matmul peak", "—"])
    fast = r.get("fast-paths", [])
    fp32 = {(v["threads"], v["compiled"]): v["img_s"] for v in fast
            if v["dtype"] == "float32" and v.get("optimizer", "adamw") == "adamw"}
    muon = {(v["threads"], v["optimizer"]): v["img_s"] for v in fast if v.get("optimizer", "adamw") != "adamw"}
    for (threads, optimizer), img_s in muon.items():
        if optimizer == "muon, NS float32":
            timms = muon[(threads, "muon, NS bfloat16")]
            rows.append([f"{fast[0]['model']}'s training step with Muon, batch {fast[0]['batch_size']}, {threads} "
                         f"thread{'s' * (threads != 1)}: Newton–Schulz in float32 against bfloat16 (timm's) (img/s)",
                         n(img_s), f"bfloat16 {n(timms)}", f"**{img_s / timms:.2f}**", "—"])
    for v in fast:
        if v.get("optimizer", "adamw") == "adamw" and (v["dtype"] != "float32" or v["compiled"]):
            what = "bf16 autocast" if v["dtype"] != "float32" else "torch.compile"
            rows.append([f"{v['model']}'s training step, batch {v['batch_size']}, {v['threads']} thread"
                         f"{'s' * (v['threads'] != 1)}: {what} against fp32 eager (img/s)", n(v["img_s"]),
                         f"fp32 eager {n(fp32[(v['threads'], False)])}", f"**{v['img_s'] / fp32[(v['threads'], False)]:.2f}**",
                         "—"])
    if "classify" in r:
        c = r["classify"]
        rows.append([f"classify {c['images']:,} photos, {c['workers']} decoding workers vs the main process (img/s)",
                     n(c["img_s_workers"]), n(c["img_s_one_process"]), f"**{c['ratio']:.2f}**", "≥ 1.6"])
    if "folders" in r:
        f = r["folders"]
        what = f"image folder of {f['images']:,} JPEGs of {f['side']} px, {f['processes']} processes"
        rows.append([f"{what}: a requeue's start to its first optimizer step against a first start's (s)",
                     f"{f['s_requeue']:.1f}", f"first start {f['s_first_start']:.1f}", f"**{f['ratio']:.2f}**",
                     "≤ 0.1"])
        if "s_requeue_data" in f:
            rows.append([f"{what}: a requeue's start to its data set up (process 0's index read) against a first "
                         f"start's (index built) (s)", f"{f['s_requeue_data']:.1f}",
                         f"first start {f['s_first_start_data']:.1f}",
                         f"{f['s_requeue_data'] / f['s_first_start_data']:.2f}", "—"])
        rows.append([f"the same folder, in one process: the walk a requeue's start does (one stat per file) against "
                     f"the walk and the check of every image a first start does (2 threads) (s)", f"{f['s_walk']:.2f}",
                     f"walk and check {f['s_walk_and_check']:.1f}", f"{f['ratio_walk']:.3f}", "—"])
    if "startup" in r:
        s = r["startup"]
        rows.append(["classify one image from the shell (s)", f"{s['s_classify']:.2f}",
                     f"`import torch, torchvision` {s['s_import']:.2f}", f"**{s['ratio']:.2f}**", "≤ 1.5"])
    return rows


def _judged(ratio: str, target: str) -> str:
    """The target, and "not met" when the measured ratio misses it."""
    if target == "—":
        return target
    value, (sign, bound) = float(ratio.strip("*")), target.split()
    met = value >= float(bound) if sign == "≥" else value <= float(bound)
    return target if met else f"{target}: **not met**"


def render_benchmark(table: str, base: Path, plans: list[Plan], records: dict[str, tuple[Path, dict]]) -> str:
    lines = []
    for job in jobs_of(table, plans):
        if job.name not in records:
            lines.append(f"*{job.label}*: pending, no record of it yet (`{shlex.join(['scripts/benchmark.py', *job.args])}` "
                         f"measures it on such a machine).\n")
            continue
        (path, r), notes = records[job.name], Notes(base)
        if "versions" not in r:  # killed at its budget before its report
            lines.append(f"*{job.label}*{budget_note(r)}, no figures: `{benchmark_command(r['command'])}`, record "
                         f"{_provenance(path, r, base, notes)}.\n")
            continue
        lines.append(f"*{job.label}*{budget_note(r)}: {_device(r)}{notes.filled(path, r, True)}, torch {r['versions']['torch']}, "
                     f"`{benchmark_command(r['command'])}`, "
                     f"record {_provenance(path, r, base, notes)}{notes.filled(path, r, False)}.\n")
        lines.append("| what | ours | reference | ratio | target |\n| --- | --- | --- | --- | --- |")
        lines += ["| " + " | ".join(row[:4] + [_judged(row[3], row[4])]) + " |" for row in _bench_rows(r)]
        lines += notes.lines() + [""]
    return "\n".join(lines)


def pages() -> list[Path]:
    """The pages whose figures blocks are rendered: README and docs/*.md."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def render(text: str, results_dir: Path, base: Path, plans: list[Plan] | None = None, *, runner) -> str:
    """A page's text (README's, a docs page's) with every figures block rendered from the records in
    ``results_dir`` that satisfy their rows (``satisfying``: ``runner.compare``), their links relative to
    ``base``, the page's folder; the rows are the plans' (default: the repository's experiments/)."""
    plans = load_all() if plans is None else plans

    def block(m: re.Match) -> str:
        table = m["table"]
        jobs = jobs_of(table, plans)
        if not jobs:
            raise ConfigError(f"a page names a figures table {table!r} that no plan measures")
        records = satisfying(table, results_dir, plans, runner)
        body = render_benchmark(table, base, plans, records) if isinstance(jobs[0], Benchmark) else \
            render_runs(table, base, plans, records)
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(block, text)
