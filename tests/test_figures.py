"""`make figures`: README's tables are the rendering of the committed records, and every run of every
plan in experiments/ runs at toy scale on CPU (--quick), a long run continued across commands."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from vit import plans
from vit.reporting import tables
from vit.exits import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SAME = SimpleNamespace(compare=lambda job, record: [])  # a runner for which every record is its row's


def committed_runner() -> plans.Runner:
    """The runner that compares the repository's records with their rows (as `make figures` does)."""
    from vit.commands.train import ArgumentCheck

    return plans.Runner(ROOT / "data", ROOT / "runs", ROOT / "results", check_command=ArgumentCheck())


def run_figures(*args: str, timeout: int = 900, offline: bool = False) -> subprocess.CompletedProcess:
    """``scripts/figures.py ARGS``; ``offline``: with no network (every connection but to this machine refused,
    tests/offline/sitecustomize.py, in it and the commands it starts)."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
    if offline:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "tests" / "offline"), env.get("PYTHONPATH")]))
    env.pop("WANDB_API_KEY", None)
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "figures.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_the_pages_tables_are_the_rendering_of_the_committed_records():
    """README and docs/*.md: every figures block is its records' rendering, and every record is linked from
    a page, with each figure of its row as the record has it."""
    pages = {page: page.read_text() for page in tables.pages()}
    assert {page.name for page in pages} >= {"README.md", "results.md", "speed.md"}
    shown = set()
    for page, text in pages.items():
        assert tables.render(text, ROOT / "results", page.parent, runner=committed_runner()) == text, f"{page}: run `make figures ARGS=--render`"
        shown |= {m["table"] for m in tables.BLOCK.finditer(text)}
    assert shown == {table for plan in plans.load_all() for table in plan.tables()}
    records = sorted((ROOT / "results").glob("*/*.json"))
    assert len(records) >= 3
    for path in records:
        record = json.loads(path.read_text())
        assert record["commit"] and record["command"] and record["device"] and record["date"], path
        linked = [page for page, text in pages.items()  # (its table's page; a note may link it from another)
                  if f"]({Path(os.path.relpath(path, page.parent)).as_posix()})" in text]
        assert linked, f"{path} is linked from no page"
        if "test_top1" in record:  # each figure of a run's row is on its page as the record has it
            assert any(f"**{record['test_top1']:.2f} %** ({record['test_top5']:.2f} %)" in pages[p] for p in linked)
    assert run_figures("--check").returncode == 0


def test_render_rewrites_stale_tables_from_the_records(tmp_path):
    """`make figures ARGS=--render`: measures nothing, rewrites a table that differs from its records."""
    readme = tmp_path / "README.md"
    shutil.copytree(ROOT / "results", tmp_path / "results")
    text = (ROOT / "README.md").read_text()
    block = next(tables.BLOCK.finditer(text))
    readme.write_text(text.replace(block.group(0), f"<!-- figures: {block['table']} -->\nstale\n<!-- /figures -->"))
    proc = run_figures("--render", "--readme", str(readme), "--results", str(tmp_path / "results"))
    assert proc.returncode == 0, proc.stderr
    assert f"rendered {readme}" in proc.stdout and readme.read_text() == text


def test_a_row_without_a_record_is_pending_and_paths_are_not_shown(tmp_path):
    text = "a\n<!-- figures: gpu -->\nstale\n<!-- /figures -->\nb\n"
    rendered = tables.render(text, tmp_path, tmp_path, runner=SAME)
    assert "stale" not in rendered and rendered.startswith("a\n") and rendered.endswith("<!-- /figures -->\nb\n")
    rows = [line for line in rendered.splitlines() if line.startswith("| vit_cifar10")]
    assert len(rows) == 2 and all(row.count("pending") == 6 for row in rows) and "`--config vit_cifar10_fast`" in rows[1]
    assert tables.shown_command("python scripts/train.py --config cpu --data.root /x/y --run a --trainer.default_root_dir "
                                 "/r --ckpt_path last --stop_after_minutes 9 --seed_everything 1") == \
        "--config cpu --seed_everything 1"
    with pytest.raises(ConfigError, match="no plan"):
        tables.render("<!-- figures: nowhere -->\n<!-- /figures -->", tmp_path, tmp_path, runner=SAME)


def test_a_gpu_row_names_what_decides_its_speed_and_what_its_clock_includes(tmp_path):
    """A GPU record's row (rendered from a record as the gpu plan writes it): the GPU with its CUDA and
    driver versions, and beside the times to accuracy the commands the run took and the seconds of their
    first batches (torch.compile's, counted in the clock)."""
    record = {"row": "vit_cifar10_fast (time to accuracy)", "command": "python scripts/train.py --config vit_cifar10_fast",
              "device": "NVIDIA H100 80GB HBM3", "device_count": 1, "cuda": "13.0", "driver": "580.65.06",
              "cpu": "AMD EPYC", "epochs": 100, "training_seconds": 900.0, "best_val_acc": 94.5, "test_top1": 94.1,
              "test_top5": 99.8, "train_images_per_second": 5e4, "commands": 2, "first_batches_seconds": 61.4,
              "time_to_val_acc": {"0.90": 300.2, "0.93": 520.0}, "commit": "0123456789", "date": "2026-11-25T00:00:00"}
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "01-vit_cifar10_fast.json").write_text(json.dumps(record))
    rendered = tables.render("<!-- figures: gpu -->\n<!-- /figures -->\n", tmp_path, tmp_path, runner=SAME)
    (row,) = [line for line in rendered.splitlines() if line.startswith("| vit_cifar10_fast")]
    assert "| 1× NVIDIA H100 80GB HBM3 (CUDA 13.0, driver 580.65.06) |" in row
    assert "| 300 s / 520 s / — (the clock includes the first batches of 2 command(s): 61 s) |" in row


def run_record(**fields) -> dict:
    """A training run's record as a plan copies it (the fields the tables show), with ``fields`` over it."""
    return {"command": "python scripts/train.py --config cpu", "device": "AMD EPYC", "device_count": 1,
            "cpu": "AMD EPYC", "torch_threads": 2, "epochs": 20, "training_seconds": 600.0, "best_val_acc": 80.0,
            "test_top1": 79.5, "test_top5": 98.5, "train_images_per_second": 2000.0, "commit": "0123456789abcdef",
            "dirty": False, "date": "2026-11-25T00:00:00", **fields}


def test_a_record_made_from_uncommitted_changes_is_marked_with_where_its_diff_is(tmp_path):
    """† after the commit of each record made from a dirty tree, and under the table one line per commit saying
    what it means: the diff beside the record (linked), or not kept; a clean record has no mark, one whose code
    state is not known (dirty: null) ¶ and a line saying so."""
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "01-smoke.json").write_text(json.dumps(run_record()))
    (tmp_path / "cpu" / "02-cpu.json").write_text(json.dumps(run_record(dirty=True, diff="02-cpu.diff")))
    (tmp_path / "cpu" / "02-cpu.diff").write_text("diff --git a/x b/x\n")
    (tmp_path / "cpu" / "03-fashion-mnist.json").write_text(json.dumps(run_record(dirty=True, commit="fedcba987654")))
    page = tmp_path / "docs"
    rendered = tables.render("<!-- figures: cpu -->\n<!-- /figures -->\n", tmp_path, page, runner=SAME)
    rows = {line.split(" | ")[0]: line for line in rendered.splitlines() if line.startswith("| ")}
    assert "`0123456`†" not in rows["| smoke recipe"] and "`0123456` 2026-11-25 |" in rows["| smoke recipe"]
    assert "`0123456`† 2026-11-25 |" in rows["| cpu recipe (10 minutes)"]
    assert "`fedcba9`† 2026-11-25 |" in rows["| cpu recipe, Fashion-MNIST as image folders (10 minutes)"]
    notes = rendered.split("<!-- /figures -->")[0].split("\n\n")[1:]  # each its own paragraph, under the table
    assert notes == ["† made from uncommitted changes to `0123456`; the diff is beside the record: "
                     "[02-cpu.diff](../cpu/02-cpu.diff).",
                     "† made from uncommitted changes to `fedcba9`; the diff was not kept.\n"]
    (tmp_path / "cpu" / "02-cpu.diff").unlink()  # a record naming a diff that is not there: not kept
    assert "the diff was not kept" in tables.render("<!-- figures: cpu -->\n<!-- /figures -->\n", tmp_path,
                                                    page, runner=SAME).split("`0123456`;")[1].split("\n")[0]
    bench = {"command": "python scripts/benchmark.py", "device": "AMD EPYC", "device_count": 1, "cpu": "AMD EPYC",
             "versions": {"torch": "2.14.1"}, "commit": "0123456789abcdef", "dirty": True, "date": "2026-11-25T00:00"}
    (tmp_path / "benchmark-cpu").mkdir()
    (tmp_path / "benchmark-cpu" / "cpu.json").write_text(json.dumps(bench))
    rendered = tables.render("<!-- figures: benchmark-cpu -->\n<!-- /figures -->\n", tmp_path, page, runner=SAME)
    assert "`0123456`† 2026-11-25." in rendered
    assert "\n\n† made from uncommitted changes to `0123456`; the diff was not kept.\n" in rendered
    for edited, refused in (({"commit": 5}, "commit: takes"), ({"commit": ["x"]}, "commit: takes"),
                            ({"diff": 7}, "diff: takes")):  # a record edited by hand: one line, never a traceback
        (tmp_path / "cpu" / "02-cpu.json").write_text(json.dumps(run_record(dirty=True, **edited)))
        with pytest.raises(ConfigError, match=f"02-cpu.json: {refused}"):
            tables.render("<!-- figures: cpu -->\n<!-- /figures -->\n", tmp_path, page, runner=SAME)
    other = [{"commit": "aaaaaaa" + "0" * 33, "dirty": False, "changes": None, "commands": 2}]
    (tmp_path / "cpu" / "02-cpu.json").write_text(json.dumps(run_record(other_code=other)))
    rendered = tables.render("<!-- figures: cpu -->\n<!-- /figures -->\n", tmp_path, page, runner=SAME)
    assert "`0123456`§ 2026-11-25 |" in rendered
    assert ("\n\n§ [02-cpu](../cpu/02-cpu.json): commands of other code than its record's commit trained the run: "
            "`aaaaaaa` (2 commands).\n") in rendered
    (tmp_path / "cpu" / "02-cpu.json").write_text(json.dumps(run_record(dirty=None)))  # git could not tell
    (tmp_path / "cpu" / "01-smoke.json").write_text(json.dumps(run_record(dirty=None, commit=None)))  # no git
    rendered = tables.render("<!-- figures: cpu -->\n<!-- /figures -->\n", tmp_path, page, runner=SAME)
    assert "`0123456`¶ 2026-11-25 |" in rendered and "`no comm`¶ 2026-11-25 |" in rendered
    assert ("\n\n¶ code state unknown: whether uncommitted changes made [01-smoke](../cpu/01-smoke.json), "
            "[02-cpu](../cpu/02-cpu.json) is not known (git could not tell, or the code ran outside a git "
            "checkout).\n") in rendered


def test_a_corrected_record_is_marked_where_its_filled_in_fields_are(tmp_path):
    """‡ after the device when a correction filled in the device's fields (after the record for any other field),
    and a footnote naming the fields and the record they came from; a correction that does not say which fields
    from which record is refused."""
    (tmp_path / "gpu").mkdir()
    (tmp_path / "benchmark-gpu").mkdir()
    (tmp_path / "benchmark-gpu" / "gpu.json").write_text("{}")
    source = {"from": "../benchmark-gpu/gpu.json", "why": "the record named the CPU"}
    record = run_record(device="NVIDIA H200", cuda="13.0", corrected={"fields": ["device", "cuda"], **source})
    (tmp_path / "gpu" / "01-vit_cifar10_fast.json").write_text(json.dumps(record))
    (tmp_path / "gpu" / "02-vit_cifar10.json").write_text(json.dumps(run_record(corrected={"fields": ["epochs"],
                                                                                           **source})))
    rendered = tables.render("<!-- figures: gpu -->\n<!-- /figures -->\n", tmp_path, tmp_path, runner=SAME)
    default, fast = [line for line in rendered.splitlines() if line.startswith("| vit_cifar10")]
    assert "| 1× NVIDIA H200 (CUDA 13.0)‡ |" in fast and "`0123456` 2026-11-25 |" in fast
    assert "| AMD EPYC, 2 threads |" in default and "`0123456` 2026-11-25‡ |" in default
    assert "\n\n‡ [01-vit_cifar10_fast](gpu/01-vit_cifar10_fast.json): `device`, `cuda` filled in by hand from the " \
           "record [benchmark-gpu/gpu](benchmark-gpu/gpu.json): the record named the CPU.\n" in rendered
    assert "\n\n‡ [02-vit_cifar10](gpu/02-vit_cifar10.json): `epochs` filled in by hand from the record " in rendered
    for bad in ("device and cuda: from the benchmark", {"fields": ["device"], "from": "../benchmark-gpu/none.json"}):
        (tmp_path / "gpu" / "01-vit_cifar10_fast.json").write_text(json.dumps({**record, "corrected": bad}))
        with pytest.raises(ConfigError, match="01-vit_cifar10_fast.json: corrected: takes"):
            tables.render("<!-- figures: gpu -->\n<!-- /figures -->\n", tmp_path, tmp_path, runner=SAME)


def quick_readme(tmp_path) -> tuple[Path, list[str]]:
    readme = tmp_path / "README.md"
    shown = dict.fromkeys(job.table for plan in plans.load_all() if not plan.history for job in plan.runs)
    readme.write_text("".join(f"<!-- figures: {t} -->\n<!-- /figures -->\n" for t in shown))
    return readme, ["--quick", "--results", str(tmp_path / "results"), "--readme", str(readme)]


def test_make_figures_measures_this_machines_table_and_then_measures_nothing(tmp_path):
    """README's `make figures` (the cpu plan, at toy scale): it measures every row of this machine's table, each
    run in one command, and renders it; once every row has its record, the same command measures nothing."""
    readme, common = quick_readme(tmp_path)
    first = run_figures(*common, "--plan", "cpu")
    assert first.returncode == 0, first.stderr[-3000:]
    smoke = json.loads((tmp_path / "results" / "cpu" / "01-smoke.json").read_text())
    assert smoke["steps"] == 2 * 400 // 50 and smoke["row"] == "smoke recipe"
    assert smoke["commands"] == 1 and "--stop_after_minutes" not in first.stdout and "--minutes" not in first.stdout
    assert json.loads((tmp_path / "results" / "benchmark-cpu" / "cpu.json").read_text())["row"] == "CPU benchmark"
    block = re.search(r"<!-- figures: cpu -->\n(.*?)<!-- /figures -->", readme.read_text(), re.S).group(1)
    # smoke, cpu, cpu on Fashion-MNIST folders (and, from a tree with uncommitted changes, their diffs in a note)
    assert "pending" not in block and block.count(".json)") == 3
    fashion = json.loads((tmp_path / "results" / "cpu" / "03-fashion-mnist.json").read_text())
    assert "--data vit.data.ImageFolderDataModule" in fashion["command"] and fashion["test_top1"] > 0
    again = run_figures(*common, "--plan", "cpu")
    assert again.returncode == 0 and "scripts/train.py" not in again.stdout and "benchmark.py" not in again.stdout


def test_each_run_is_one_command_unless_minutes_bounds_them(tmp_path):
    """The gpu plan, in order of value, within its 8.5 minutes: the default recipe, then where a training step
    goes (the breakdown benchmark), the benchmarks, then the fast recipe (time to 90/93/94 %), each with its own
    budget, the budgets summing to at most the plan's. By default every training run is
    one command, run whole (a run cut into commands restarts and recompiles in each); with --minutes every
    training command stops in time and the next continues it, and a benchmark without a budget of its own is
    bounded too (vit-benchmark --minutes)."""
    from vit import configs
    from vit.commands.figures import main, parser

    gpu = plans.load(plans.find("gpu"))
    jobs = gpu.runs
    assert jobs[0].args == ("--config", "vit_cifar10") and jobs[-1].args == ("--config", "vit_cifar10_fast")
    assert isinstance(jobs[1], plans.Benchmark) and "breakdown" in jobs[1].args[1]
    assert gpu.budget_minutes <= 8.5 and all(job.minutes for job in jobs)
    assert sum(job.minutes for job in jobs) <= gpu.budget_minutes
    assert "vit.training.callbacks.TimeToAccuracy" in configs.path("vit_cifar10_fast").read_text()
    assert any(isinstance(job, plans.Benchmark) for job in jobs)
    assert parser.parse_args([]).minutes is None
    whole = plans.Runner(tmp_path / "data", tmp_path / "runs", tmp_path / "results")
    bounded = plans.Runner(tmp_path / "data", tmp_path / "runs", tmp_path / "results", minutes=9)
    for job in jobs:
        if isinstance(job, plans.Run):
            command = whole.train_command(job)
            assert "--stop_after_minutes" not in command and command[command.index("--ckpt_path") + 1] == "last"
            command = bounded.train_command(job)
            assert command[command.index("--stop_after_minutes") + 1] == "9"
            assert command[command.index("--ckpt_path") + 1] == "last"
        else:
            own = f"{job.minutes * (1 - plans.plan_file.RESERVE_SHARE):.3g}"  # its budget, less the reserve
            for runner in (whole, bounded):
                command = runner.benchmark_command(job, tmp_path / "out.json")
                assert command[command.index("--minutes") + 1] == own
    assert main(["--minutes", "0", "--plan", "gpu"]) == 2


@pytest.mark.long
def test_a_long_run_is_measured_in_commands_that_continue_it(tmp_path):
    """A command of 0.3 minutes stops the smoke run after its first epoch (exit 4); the same command again
    continues it from its checkpoint, and the run does every step once."""
    readme, common = quick_readme(tmp_path)
    first = run_figures(*common, "--plan", "cpu", "--minutes", "0.3", "--max-commands", "1")
    assert first.returncode == 4, first.stderr[-3000:]
    assert "stopped after epoch 0, in time for --stop_after_minutes 0.3" in first.stderr
    assert "run the same command again to continue" in first.stderr
    assert not (tmp_path / "results" / "cpu").exists()
    import torch

    (last,) = tmp_path.glob("results/.quick/runs/cpu/01-smoke/checkpoints/last.ckpt")
    first_clock = next(v for k, v in torch.load(last, weights_only=True)["callbacks"].items() if k.startswith("TrainingClock"))
    again = run_figures(*common, "--plan", "cpu")
    assert again.returncode == 0, again.stderr[-3000:]
    assert re.search(r"resuming \S+/cpu/01-smoke from its last.ckpt", again.stderr + again.stdout)  # continued
    smoke = json.loads((tmp_path / "results" / "cpu" / "01-smoke.json").read_text())
    assert smoke["steps"] == 2 * 400 // 50  # every step once
    # the record's wall time is both commands': the first's to its checkpoint, and at least the second's training
    assert first_clock["wall_seconds"] > first_clock["training_seconds"] > 0
    assert smoke["wall_seconds"] > first_clock["wall_seconds"] + smoke["training_seconds"] - first_clock["training_seconds"]
    # two commands, each with its first training and validation batch (where torch.compile would compile again)
    assert first_clock["commands"] == 1 and smoke["commands"] == 2
    assert 0 < first_clock["first_batches_seconds"] < smoke["first_batches_seconds"] < smoke["training_seconds"]


@pytest.mark.long
def test_quick_runs_every_run_of_every_plan(tmp_path):
    readme, common = quick_readme(tmp_path)
    again = run_figures(*common, timeout=3600)  # --quick: every plan of experiments/ but the history plans
    assert again.returncode == 0, again.stderr[-3000:]
    every = [plan for plan in plans.load_all() if not plan.history]  # (history plans: test_history_plans_...)
    jobs = [job for plan in every for job in plan.runs]
    at_once = sum(isinstance(job, plans.Run) for plan in every if plan.resources["at_once"] > 1 for job in plan.runs)
    assert len(re.findall(r"\(core \d+\)", again.stdout)) == at_once  # runs at once, a core each (test_plans: a users' plan)
    benchmarks = sum(isinstance(job, plans.Benchmark) for job in jobs)
    assert benchmarks >= 3  # --quick runs the benchmark once and gives its report to every other benchmark job
    assert again.stdout.count("scripts/benchmark.py") == 1
    assert again.stdout.count("the --quick benchmark's report") == benchmarks - 1
    for job in jobs:
        record = json.loads((tmp_path / "results" / job.table / f"{job.name}.json").read_text())
        assert record["row"] == job.label and record["commit"]
        if getattr(job, "commit", None):  # run from its own checkout: its code made the record
            assert record["commit"].startswith(job.commit) and record["dirty"] is False
        if isinstance(job, plans.Run):
            assert record["epochs"] == 2 and 0 <= record["test_top1"] <= 100
            assert record["recipe"] == job.args[1]
    text = readme.read_text()
    assert "pending" not in text and text.count("](") == len(jobs)
    assert "time to 90 / 93 / 94 %" in text  # the fast recipe's TimeToAccuracy reached the record


def test_each_recipe_header_states_its_measured_figure_as_readme_does():
    """A recipe's header gives the figure of its README row on CIFAR-10 and names the record; one whose row has no
    record that satisfies it (none, or another run's: the row is pending) says it is pending. (A row on other
    data is the recipe's, not its header's.)"""
    every = plans.load_all()
    shown = {**tables.satisfying("cpu", ROOT / "results", every, committed_runner()),
             **tables.satisfying("gpu", ROOT / "results", every, committed_runner())}
    for job in [job for job in tables.jobs_of("cpu", every) + tables.jobs_of("gpu", every) if job.data == "cifar"]:
        recipe = job.args[job.args.index("--config") + 1]
        header = "\n".join(line for line in (ROOT / "configs" / f"{recipe}.yaml").read_text().splitlines()
                           if line.startswith("#"))
        assert "issue" not in header.lower() and "# Run:" in header and "# Measured:" in header, recipe
        if job.name in shown:
            r = shown[job.name][1]
            assert f"test top-1 {r['test_top1']:.2f} % (top-5 {r['test_top5']:.2f} %)" in header, recipe
            assert f"results/{job.table}/{job.name}.json" in header, recipe
        else:
            assert "# Measured: pending" in header, recipe


def test_help_says_where_the_plans_are_and_how_to_run_one():
    from vit.commands.figures import main, parser

    text = parser.format_help()
    assert "--plan PLAN" in text and "experiments/" in text and 'make figures ARGS="--plan ' in text
    assert main(["--plan", "no-such-plan", "--check"]) == 2


def test_history_plans_do_not_run_and_their_tables_render_from_the_committed_records(tmp_path):
    """`make figures --quick` skips the history plans (their runs need options this version no longer has);
    their tables come whole from the records in the repository's results/."""
    history = [plan for plan in plans.load_all() if plan.history]
    assert {plan.name for plan in history} >= {"cpu-ns-float32", "cpu-mimetic", "cpu-options"}
    for plan in history:
        for job in plan.runs:
            assert (ROOT / "results" / job.table / f"{job.name}.json").is_file(), f"{plan.name}: {job.name}"
        text = "".join(f"<!-- figures: {t} -->\n<!-- /figures -->\n" for t in sorted(plan.tables()))
        rendered = tables.render(text, ROOT / "results", ROOT, runner=committed_runner())
        assert "pending" not in rendered and rendered.count("](") == len(plan.runs), plan.name


def table_commands() -> dict[str, str]:
    """Each command the rows of the pages' figures blocks show (a run's, in its command column), once, and
    once for commands that differ only by their seed: the command → the page and table that show it first."""
    found, seen = {}, set()
    for page in tables.pages():
        for block in tables.BLOCK.finditer(page.read_text()):
            for row in block["body"].splitlines():
                cells = row.split(" | ")
                command = cells[1].split("`")[1] if len(cells) > 2 and cells[1].startswith("`") else None
                if command and re.sub(r" --seed_everything \d+", "", command) not in seen:
                    seen.add(re.sub(r" --seed_everything \d+", "", command))
                    found[command] = f"{page.name} ({block['table']})"
    return found


def printed_config(argv: list[str]) -> dict:
    """vit-train's --print_config for ``argv``, in this process (parse only: nothing trains)."""
    import contextlib
    import io

    import yaml

    from vit.commands.train import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as end:
        main([*argv, "--print_config"])
    assert end.value.code in (0, None), f"{shlex.join(argv)}: exit {end.value.code}"
    return yaml.safe_load(out.getvalue())


def test_every_command_a_table_shows_runs_as_typed_and_sets_what_it_says(tmp_path, monkeypatch):
    """The pages' tables show each record's command in today's option names (vit.models.checkpoints.todays_words, the
    mapping checkpoints of earlier versions are read with): `vit-train COMMAND --print_config` parses each one,
    and each option it names holds its value in the printed config. The records keep the command as it ran."""
    import yaml

    monkeypatch.chdir(tmp_path)
    commands = table_commands()
    assert len(commands) >= 25 and "--config cpu --seed_everything 0 --model.optimizer.name adamw" in commands
    for command, where in commands.items():
        words = shlex.split(command)
        config = printed_config(words)
        for option, value in zip(words, words[1:]):
            if not option.startswith("--") or option == "--config":
                continue
            got = config
            for key in option.removeprefix("--").split("."):
                got = got[key] if key in got else got["init_args"][key]
            expected = yaml.safe_load(value)
            got = got["class_path"] if isinstance(got, dict) and "class_path" in got else got
            assert got == (float(expected) if isinstance(got, float) else expected), f"{where}: {command}: {option}"
    raw = json.loads((ROOT / "results" / "muon-horizon" / "adamw-10min-s0.json").read_text())["command"]
    assert "--model.optimizer adamw" in raw and "--model.optimizer.name adamw" in tables.shown_command(raw)


def test_a_row_names_the_settings_no_option_says_today_outside_its_command():
    """An option that left: dropped where its value is what the code does now, else named beside the command
    (not in it: the command must still run as typed)."""
    cell = tables.command_cell("python scripts/train.py --config cpu --model.muon_ns_dtype auto --model.decay linear "
                               "--model.lr=1e-3 --model.optimizer sgd --model.tta_flip false")
    assert cell == "`--config cpu --model.optimizer.lr=1e-3 --model.optimizer sgd` with decay linear (not an option today)"


def test_no_page_shows_make_figures_for_a_plan_that_does_not_run():
    """A `make figures ARGS="... --plan NAME ..."` line on a page names a plan that runs (not a history plan,
    which keeps only its records)."""
    runnable = {plan.name for plan in plans.load_all() if not plan.history}
    named = [(page.name, m[1]) for page in [*tables.pages(), *sorted((ROOT / "configs").glob("*.yaml")),
                                            *sorted((ROOT / "experiments").glob("*.yaml"))]
             for m in re.finditer(r'make figures ARGS="[^"]*--plan ([\w-]+)', page.read_text())]
    assert named
    assert [(page, name) for page, name in named if name not in runnable] == []


REHEARSAL_SCALE = 0.45  # the gpu plan's 8.5 minutes → 3.8 minutes on this machine's CPU
STARTUP_MARGIN = 30  # s: Python's start-up and the plan's parse before its clock starts, the pages' rendering after


@pytest.mark.long
@pytest.mark.lowest  # (make test-lowest: with torch 2.11, the GPU machines' torch, too)
def test_the_gpu_plan_rehearsed_on_a_cpu_writes_every_rows_record_inside_its_scaled_budget(tmp_path):
    """`make figures --plan gpu --scale S` on a CPU, offline, with CIFAR-10 (generated, in the official format)
    where `make data` puts it: the gpu plan's own rows, each in S times its budget, write their records (or are
    skipped, pending, with one line, where what is left of the plan's budget cannot hold them), and the command
    ends within S times the plan's 8.5 minutes and a fixed margin for Python's start-up."""
    import time

    from vit.data.cifar import write_fake

    gpu = plans.load(plans.find("gpu"))
    data = write_fake(tmp_path / "data", per_batch=400, test_size=500)
    readme = tmp_path / "README.md"
    readme.write_text("<!-- figures: gpu -->\n<!-- /figures -->\n")
    start = time.monotonic()
    proc = run_figures("--plan", "gpu", "--scale", str(REHEARSAL_SCALE), "--data-root", str(data), "--runs",
                       str(tmp_path / "runs"), "--results", str(tmp_path / "results"), "--readme", str(readme),
                       timeout=900, offline=True)
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert took < 60 * gpu.budget_minutes * REHEARSAL_SCALE + STARTUP_MARGIN, took
    skipped = re.findall(r"\[plan\] ([\w-]+): skipped: needs [\d.e-]+ min, [\d.e-]+ left", proc.stdout)
    for job in gpu.runs:
        record = tmp_path / "results" / job.table / f"{job.name}.json"
        assert record.is_file() != (job.name in skipped), (job.name, proc.stdout[-3000:])
        if record.is_file():
            written = json.loads(record.read_text())
            budget = written["budget"]
            assert budget["minutes"] == pytest.approx(job.minutes * REHEARSAL_SCALE)
            # figures of its own, or said to be its budget's stop (a CPU compiles the GPU recipes for minutes)
            assert budget["stopped_by_budget"] or ("test_top1" in written if isinstance(job, plans.Run) else
                                                   "versions" in written), (job.name, written)
            assert written.get(plans.run_here.NO_FIGURES) is None or budget["stopped_by_budget"]
    assert not skipped, proc.stdout[-3000:]


def test_a_record_the_runner_wrote_for_a_killed_job_never_satisfies_its_row(tmp_path):
    """A job its budget killed before it wrote its own record gets one from the runner (what made it, no figures):
    that record differs from the row's run, so its row stays pending and runs again, the same configuration or
    not; the job's own record of the same run satisfies it."""
    gpu = plans.load(plans.find("gpu"))
    runner = committed_runner()
    run, bench = gpu.runs[0], next(job for job in gpu.runs if isinstance(job, plans.Benchmark))
    for job in (run, bench):
        own = runner.budget_record(tmp_path / "missing.json", job, killed=True)
        assert own["budget"]["stopped_by_budget"] and own[plans.run_here.NO_FIGURES]
        assert runner.compare(job, own) == ["figures: none (its budget ended it before it wrote its record)"]
        del own[plans.run_here.NO_FIGURES]  # the same run, with figures of its own: it satisfies the row
        assert runner.compare(job, own) == []


def test_a_scaled_rehearsal_never_writes_into_the_repositorys_records():
    done = run_figures("--plan", "gpu", "--scale", "0.5", "--render")
    assert done.returncode == 2 and done.stderr.startswith("error: --scale needs --results DIR"), done.stderr


def test_a_job_killed_at_its_budget_leaves_no_half_written_kernel_for_the_next(tmp_path):
    """The plan's jobs compile into a cache of the plan's own (TORCHINDUCTOR_CACHE_DIR under its runs folder, never
    the user's); a job killed at its budget (here: one that writes a kernel file and sleeps) may leave a kernel half
    written, which the next compile would load and fail on (torch 2.11: "ImportError: ... file too short"): the
    kill empties that cache."""
    runner = plans.Runner(tmp_path / "data", tmp_path / "runs", tmp_path / "results", scale=0.01)
    job = next(job for job in plans.load(plans.find("gpu")).runs if isinstance(job, plans.Benchmark))
    writes = ("import os, pathlib, time; d = pathlib.Path(os.environ['TORCHINDUCTOR_CACHE_DIR']); "
              "d.mkdir(parents=True); (d / 'main.so').write_bytes(b'half'); print('written', flush=True); time.sleep(60)")
    proc = runner.popen([sys.executable, "-c", writes], env=runner.environment(False), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "written"
    assert (tmp_path / "runs" / ".compile-cache" / "main.so").is_file()
    started = time.monotonic()
    assert runner.wait([(job, proc)]) == [None]  # killed at its budget (0.01 × its minutes)
    assert time.monotonic() - started < 30 and not (tmp_path / "runs" / ".compile-cache").exists()
