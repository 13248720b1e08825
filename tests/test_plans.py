"""vit-plan: a plan file (a grid of recipe changes × seeds) is checked with one line naming its file and key,
runs here with every run in one W&B group, becomes one SLURM job array with the plan's resources, and renders
a table of mean and spread over seeds from the runs' records. Every plan in experiments/ loads."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from vit import plans
from vit.reporting import tables
from vit.commands.train import ArgumentCheck
from vit.commands.plan import main

from helpers import wandb_records

ROOT = Path(__file__).resolve().parents[1]
TOY = ["--config", "smoke", "--model.arch.dim", "16", "--model.arch.depth", "1", "--model.arch.heads", "2",
       "--trainer.max_epochs", "1", "--data.batch_size", "50", "--data.val_size", "100", "--data.num_workers", "0"]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def tiny_plan(path: Path) -> Path:
    """A user's plan: 2 changes × 2 seeds of a toy recipe, two runs at once."""
    return write(path, f"""# weight decay against none, at toy scale
args: {json.dumps(TOY)}
seeds: [0, 1]
resources: {{cpus: 1, at_once: 2}}
runs:
  - {{name: base, label: the toy recipe}}
  - {{name: nowd, label: + no weight decay, args: [--model.optimizer.weight_decay, 0]}}
""")


def test_every_plan_of_experiments_loads_and_expands_and_fills_a_page_table():
    every = plans.load_all()
    assert {p.name for p in every} >= {"cpu", "gpu", "muon-horizon", "cpu-ns-float32", "fashion-mnist"}
    shown = {m["table"] for page in tables.pages() for m in tables.BLOCK.finditer(page.read_text())}
    for plan in every:
        assert plan.runs and plan.tables() <= shown, plan.path
        assert plan.path.read_text().startswith("#"), f"{plan.path}: a header comment says what it measures"
        names = [job.name for job in plan.runs]
        assert len(set(names)) == len(names)
        for job in plan.runs:
            if isinstance(job, plans.Run):
                assert job.args[:2] == ("--config", job.args[1]) and job.label and job.table == plan.table
    earlier = plans.load(plans.find("cpu-ns-float32"))
    assert [job.name for job in earlier.runs if job.commit] == ["nsbf16-warm1-s0", "nsbf16-warm1-s1"]
    assert all("2f47865" not in job.label and "2f47865" not in job.name for job in earlier.runs)


def test_a_plan_expands_to_seeds_budgets_and_groups_in_its_order(tmp_path):
    plan = plans.load(write(tmp_path / "grid.yaml", """
args: [--config, cpu]
seeds: [0, 1]
minutes: 10
resources: {at_once: 2}
runs:
  - {name: a}
  - {name: b, label: + b, args: [--model.augmentation.mixup, 0.2, --model.tta_flip, true], minutes: 90, seeds: [3]}
  - {name: bench, benchmark: [--sections, step]}
"""))
    assert plan.table == "grid" and [job.name for job in plan.runs] == ["a-s0", "a-s1", "b-s3", "bench"]
    assert plan.runs[0].args == ("--config", "cpu")
    # a run's minutes are its whole command's budget: it trains for that less a reserve (start-up, compile, test)
    assert plan.runs[0].owned() == ("--seed_everything", "0", "--trainer.max_time", "00:00:07:40",
                                    "--data", "vit.data.CIFAR10DataModule")
    assert plan.runs[2].args[2:] == ("--model.augmentation.mixup", "0.2", "--model.tta_flip", "true")
    assert plan.runs[2].owned()[:4] == ("--seed_everything", "3", "--trainer.max_time", "00:01:11:40")
    assert plan.runs[2].label == "+ b, seed 3" and plan.runs[3].table == "benchmark-grid"
    assert [[job.name for job in group] for group in plan.groups()] == [["a-s0", "a-s1"], ["b-s3"], ["bench"]]


@pytest.mark.parametrize("text, key", [
    ("runs: [{name: a}]\nsead: [0]\n", "sead"),
    ("runs: []\n", "runs"),
    ("runs: [{name: a, arg: [--x]}]\n", "runs[0].arg"),
    ("runs: [{name: a b}]\n", "runs[0].name"),
    ("seeds: [0, 0]\nruns: [{name: a}]\n", "seeds"),
    ("minutes: -1\nruns: [{name: a}]\n", "minutes"),
    ("minutes: .nan\nruns: [{name: a}]\n", "minutes"),
    ("minutes: .inf\nruns: [{name: a}]\n", "minutes"),
    ("minutes: true\nruns: [{name: a}]\n", "minutes"),
    ("runs: [{name: a, minutes: .nan}]\n", "runs[0].minutes"),
    ("seeds: [0.5]\nruns: [{name: a}]\n", "seeds"),
    ("seeds: [true]\nruns: [{name: a}]\n", "seeds"),
    ("runs: [{name: a, seeds: [-1]}]\n", "runs[0].seeds"),
    ("resources: {cpus: 1.5}\nruns: [{name: a}]\n", "resources.cpus"),
    ("resources: {cpus: .inf}\nruns: [{name: a}]\n", "resources.cpus"),
    ("resources: {gpus: -1}\nruns: [{name: a}]\n", "resources.gpus"),
    ("resources: {at_once: true}\nruns: [{name: a}]\n", "resources.at_once"),
    ("resources: {memory: lots}\nruns: [{name: a}]\n", "resources.memory"),
    ("resources: {gpu: 1}\nruns: [{name: a}]\n", "resources.gpu"),
    ("resources: {at_once: 0}\nruns: [{name: a}]\n", "resources.at_once"),
    ("runs: [{name: a, args: [--model.mimetic, [0.7, 0.4]]}]\n", "runs[0].args"),
    ("runs: [{name: a, benchmark: [], seeds: [0]}]\n", "runs[0].seeds"),
    ("runs: [{name: a, commit: HEAD}]\n", "runs[0].commit"),
    ("runs: [{name: a}, {name: a}]\n", "runs: the run a comes twice"),
    ("runs: [{name: a, seeds: [0]}, {name: a, seeds: [1], args: [--model.arch.depth, 2]}]\n",
     "runs[1].name: a is also runs[0]'s, with another args: a name is one run of the table"),
    ("seeds: [0, 1]\nruns: [{name: a}, {name: a, minutes: 2}]\n", "runs[1].name: a is also runs[0]'s, with another minutes"),
    ("runs: [{name: a, seeds: [0], label: x}, {name: a, seeds: [1]}]\n", "runs[1].name: a is also runs[0]'s, with another label"),
    ("runs: [{name: a, benchmark: []}, {name: a, benchmark: [--quick]}]\n", "runs[1].name: a is also runs[0]'s, with another benchmark"),
    ("runs: [{name: a, seeds: [0]}, {name: a, seeds: [0, 1]}]\n", "runs: the run a-s0 comes twice"),
    ("runs: [{name: a, seeds: [0]}, {name: a-s0}]\n", "runs: the run a-s0 comes twice"),
    ("seeds: [0]\nruns: [{name: a, args: [--seed_everything, 3]}]\n", "runs[0].args: --seed_everything is the plan's"),
    ("minutes: 2\nruns: [{name: a, args: [--trainer.max_time=00:00:10:00]}]\n", "runs[0].args: --trainer.max_time"),
    ("args: [--data.root, /elsewhere]\nruns: [{name: a}]\n", "args: --data.root is the plan's"),
    ("runs: [{name: a, data: fashion-mnist, args: [--data, vit.data.CIFAR10DataModule]}]\n", "runs[0].args: --data "),
    ("runs: [{name: a, args: [--run, b]}]\n", "runs[0].args: --run is the plan's"),
    ("runs: [{name: a, data: [cifar]}]\n", "runs[0].data"),
    ("runs: [{name: a}\n", "not YAML"),
])
def test_a_bad_plan_file_is_one_line_naming_the_file_and_the_key(tmp_path, capsys, text, key):
    path = write(tmp_path / "bad.yaml", text)
    assert main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: {key}") and err.count("\n") == 1 and "Traceback" not in err
    assert main(["run", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: no such plan file" in capsys.readouterr().err


@pytest.mark.parametrize("runs, said", [
    ("[{name: ok}, {name: old, args: [--model.lr, 0.1]}]", "run old: --model.lr 0.1 is --model.optimizer.lr 0.1 now"),
    ("[{name: typo, args: [--model.optimizer.lrr, 0.1]}]", "run typo: unrecognized arguments: --model.optimizer.lrr"),
    ("[{name: b, benchmark: [--dtype, float64]}]", "run b: vit-benchmark: argument --dtype: invalid choice"),
    ("[{name: b, benchmark: [--bogus]}]", "run b: vit-benchmark: unrecognized arguments: --bogus"),
])
@pytest.mark.parametrize("command", ["show", "run", "submit"])
def test_a_runs_bad_or_old_option_is_refused_before_any_work(tmp_path, capsys, runs, said, command):
    path = write(tmp_path / "bad.yaml", f"args: [--config, smoke]\nruns: {runs}\n")
    extra = [] if command == "show" else ["--runs", str(tmp_path / "runs")] + (["--dry-run"] if command == "submit" else [])
    assert main([command, str(path), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: {said}") and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


def test_a_run_of_another_commit_is_not_checked_against_todays_options(tmp_path, capsys):
    path = write(tmp_path / "old.yaml", "args: [--config, smoke]\nruns: [{name: a, commit: abcdef0, "
                                        "args: [--model.lr, 0.1]}]\n")
    assert main(["show", str(path)]) == 0
    assert "--model.lr 0.1" in capsys.readouterr().out


def test_submit_writes_one_job_array_with_the_plans_resources(tmp_path, capsys):
    plan = write(tmp_path / "sweep.yaml", """# a sweep
args: [--config, vit_cifar10]
seeds: [0, 1, 2]
resources: {cpus: 8, gpus: 1, memory: 32G, time: "02:00:00"}
runs:
  - {name: base}
  - {name: ema, args: [--model.ema_decay, 0.999]}
""")
    assert main(["submit", str(plan), "--runs", str(tmp_path / "runs"), "--data-root", str(tmp_path / "data"),
                 "--dry-run"]) == 0
    script = tmp_path / "runs" / "sweep" / "sweep.sbatch"
    text = script.read_text()
    assert text in capsys.readouterr().out
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert directives == ["#SBATCH --job-name=sweep", "#SBATCH --array=0-5", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1",
                          "#SBATCH --cpus-per-task=8", "#SBATCH --gres=gpu:1", "#SBATCH --mem=32G",
                          "#SBATCH --time=02:00:00", "#SBATCH --signal=SIGUSR1@90", "#SBATCH --requeue",
                          "#SBATCH --open-mode=append", f"#SBATCH --output={tmp_path}/runs/sweep/slurm-%A_%a.out"]
    assert "export WANDB_RUN_GROUP=sweep\n" in text
    arms = re.findall(r"^  (\d+)\) if \[ -e \S+ \]; then echo .*; else cd (\S+) && srun (.*) \|\| status=\$\?; fi ;;$",
                      text, re.M)
    assert [int(i) for i, _, _ in arms] == list(range(6)) and {cwd for _, cwd, _ in arms} == {str(ROOT)}
    expanded = plans.load(plan).runs
    for (_, _, command), job in zip(arms, expanded):  # task i: the plan's run i, as vit-plan run starts it
        assert command == f"{sys.executable} {ROOT}/scripts/train.py {' '.join(job.args)} --seed_everything " \
                          f"{job.name[-1]} --data vit.data.CIFAR10DataModule --data.root {tmp_path}/data " \
                          f"--trainer.default_root_dir {tmp_path}/runs/sweep --run {job.name} --ckpt_path last"
    assert 'scontrol requeue "${SLURM_JOB_ID}"' in text  # a task stopped by SIGUSR1 (exit 4) continues
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    # task 5 is the plan's run 5 (vit-plan show numbers them as the array does)
    assert main(["show", str(plan)]) == 0
    assert re.search(r"^\s+5  ema-s2: ema, seed 2$", capsys.readouterr().out, re.M)
    assert main(["run", str(plan), "--index", "6"]) == 2
    assert "--index 6: the plan has runs 0 to 5" in capsys.readouterr().err


@pytest.mark.long
def test_a_users_plan_runs_here_in_one_wandb_group_and_its_table_has_mean_and_spread(tmp_path, fake_cifar):
    """2 changes × 2 seeds at toy scale, W&B on (offline: no credentials), as a user runs it from the shell."""
    plan = tiny_plan(tmp_path / "wd-grid.yaml")
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_RUN_GROUP")}
    env.update(WANDB_SILENT="true", PYTHONUNBUFFERED="1")

    def plan_command(*args):
        return subprocess.run([sys.executable, str(ROOT / "scripts" / "plan.py"), *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=900)

    done = plan_command("run", plan.name, "--data-root", str(fake_cifar))
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(re.findall(r"\(core \d+\)", done.stdout)) == 4  # two at a time, a core each
    runs = tmp_path / "runs" / "wd-grid"
    for name in ("base-s0", "base-s1", "nowd-s0", "nowd-s1"):
        record = json.loads((runs / name / "results.json").read_text())
        seed = name[-1]
        assert f"--seed_everything {seed}" in record["command"]
        assert ("--model.optimizer.weight_decay 0" in record["command"]) == name.startswith("nowd")
        # the W&B run's own record carries the group: RunRecord.run_group (field 6, a string), the plan's name
        (wandb_file,) = (runs / name / "wandb").glob("offline-run-*/run-*.wandb")
        assert b"\x32" + bytes([len("wd-grid")]) + b"wd-grid" in b"".join(wandb_records(wandb_file)), name
    table = plan_command("table", plan.name)
    assert table.returncode == 0, table.stderr
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table.stdout.splitlines()}
    for label, own in (("the toy recipe", "the plan's"), ("+ no weight decay", "`--model.optimizer.weight_decay 0`")):
        row = rows[label]
        assert row[1] == own and row[2] == "2 of 2"
        got = [json.loads((runs / f"{'base' if label == 'the toy recipe' else 'nowd'}-s{s}" / "results.json")
                          .read_text())["test_top1"] for s in (0, 1)]
        mean, spread = (float(x) for x in row[3].split(" ± "))
        assert mean == pytest.approx(sum(got) / 2, abs=0.006)
        assert spread == pytest.approx(abs(got[0] - got[1]) / 2 ** 0.5, abs=0.006)
    again = plan_command("run", plan.name, "--data-root", str(fake_cifar))  # every run has its record
    assert again.returncode == 0 and "train.py" not in again.stdout
    assert again.stdout.count("4 of 4 runs have their records: nothing to run") == 1


def test_a_table_before_any_run_says_pending_and_a_history_plan_renders_but_does_not_run(tmp_path, capsys):
    plan = tiny_plan(tmp_path / "grid.yaml")
    assert main(["table", str(plan), "--runs", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert out.count("| 0 of 2 | pending | pending | pending | pending |") == 2
    old = write(tmp_path / "old.yaml", plan.read_text() + "history: true\n")
    assert main(["run", str(old), "--runs", str(tmp_path / "runs")]) == 2
    assert "history: a plan kept for its records" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def configured(plan: Path, name: str) -> dict:
    """A record's ``configuration``: the one the plan runs its run ``name`` with (so that the record is its row's)."""
    job = next(job for job in plans.load(plan).runs if job.name == name)
    return {"configuration": plans.Runner(ROOT / "data", ROOT / "runs", check_command=ArgumentCheck()).configuration(job)}


def test_a_table_leaves_out_a_missing_value_and_names_a_torn_record_in_one_line(tmp_path, capsys):
    plan = tiny_plan(tmp_path / "grid.yaml")
    folder = tmp_path / "runs" / "grid"
    record = {"test_top1": 50.0, "best_val_acc": 52.0, "epochs": 1, "train_images_per_second": 100.0}
    for name, best in (("base-s0", 52.0), ("base-s1", None)):  # a non-finite best is written null
        (folder / name).mkdir(parents=True)
        (folder / name / "results.json").write_text(json.dumps({**record, "best_val_acc": best} | configured(plan, name)))
    assert main(["table", str(plan), "--runs", str(tmp_path / "runs")]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| the toy recipe"))
    assert "| 2 of 2 | 50.00 ± 0.00 | 52.00 (n=1) | 1.0 ± 0.0 |" in row
    (folder / "base-s1" / "results.json").write_text('{"test_top1": 5')  # torn
    assert main(["table", str(plan), "--runs", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "base-s1/results.json: not a readable record" in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_table_marks_a_row_with_a_record_made_from_uncommitted_changes_and_says_where_its_diff_is(
        tmp_path, capsys, monkeypatch):
    plan = tiny_plan(tmp_path / "grid.yaml")
    folder = tmp_path / "runs" / "grid"
    record = {"test_top1": 50.0, "best_val_acc": 52.0, "epochs": 1, "train_images_per_second": 100.0,
              "commit": "0123456789abcdef0123456789abcdef01234567"}
    for name in ("base-s0", "base-s1", "nowd-s0", "nowd-s1"):
        (folder / name).mkdir(parents=True)
        (folder / name / "results.json").write_text(json.dumps({**record, "dirty": name == "base-s1"} | configured(plan, name)))
    monkeypatch.chdir(tmp_path)
    assert main(["table", str(plan), "--runs", "runs"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("| the toy recipe", "| + no weight decay"))]
    assert len(rows) == 2 and "| 2 of 2† | 50.00" in rows[0] and "| 2 of 2 | 50.00" in rows[1], out
    assert "† made from uncommitted changes to `0123456`; the diff was not kept." in out
    (folder / "nowd-s0" / "results.json").write_text(json.dumps({**record, "dirty": None} | configured(plan, "nowd-s0")))
    assert main(["table", str(plan), "--runs", "runs"]) == 0  # its code state not known: marked too
    out = capsys.readouterr().out
    assert "| + no weight decay | `--model.optimizer.weight_decay 0` | 2 of 2¶ | 50.00" in out, out
    assert "¶ code state unknown: whether uncommitted changes made [results](runs/grid/nowd-s0/results.json) is " \
           "not known" in out
    (folder / "base-s1" / "results.diff").write_text("diff --git a/x b/x\n")
    (folder / "base-s1" / "results.json").write_text(json.dumps({**record, "dirty": True, "diff": "results.diff"}
                                                                | configured(plan, "base-s1")))
    assert main(["table", str(plan), "--runs", "runs"]) == 0
    out = capsys.readouterr().out
    assert "the diff is beside the record: [results.diff](runs/grid/base-s1/results.diff)." in out, out
    (folder / "base-s1" / "results.json").write_text(json.dumps({**record, "dirty": True, "diff": 5}  # edited
                                                                | configured(plan, "base-s1")))
    assert main(["table", str(plan), "--runs", "runs"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "base-s1/results.json: diff: takes" in err and err.count("\n") == 1, err


@pytest.mark.long
def test_the_commands_of_docs_experiments_run_as_a_user_types_them(tmp_path):
    """docs/experiments.md's show, submit --dry-run and table, as subprocesses."""
    def plan(*args):
        done = subprocess.run([sys.executable, "scripts/plan.py", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    example = "experiments/examples/weight-decay.yaml"
    loaded = plans.load(ROOT / example)
    shown = plan("show", example)
    assert f"{len(loaded.runs)} run(s)" in shown and all(job.name in shown for job in loaded.runs)
    plan("submit", example, "--dry-run", "--runs", str(tmp_path))
    script = (tmp_path / loaded.table / f"{loaded.table}.sbatch").read_text()
    assert f"#SBATCH --array=0-{len(loaded.runs) - 1}" in script
    assert f"#SBATCH --cpus-per-task={loaded.resources['cpus']}" in script
    assert f"#SBATCH --mem={loaded.resources['memory']}" in script and loaded.resources["memory"]
    assert f"#SBATCH --time={loaded.resources['time']}" in script and loaded.resources["time"]
    first = next(job for job in loaded.runs if isinstance(job, plans.Run))
    same = [job for job in loaded.runs if isinstance(job, plans.Run) and job.change == first.change]
    from vit.commands.train import ArgumentCheck

    runner = plans.Runner(ROOT / "data", tmp_path, None, check_command=ArgumentCheck())
    for job, top1 in zip(same[:2], (60.0, 62.0)):  # records of the plan's runs: their configurations are the plan's
        (tmp_path / job.table / job.name).mkdir(parents=True)
        (tmp_path / job.table / job.name / "results.json").write_text(json.dumps(
            {"test_top1": top1, "best_val_acc": top1, "epochs": 2, "train_images_per_second": 10.0,
             "configuration": runner.configuration(job)}))
    table = plan("table", example, "--runs", str(tmp_path))
    row = next(line for line in table.splitlines() if line.startswith(f"| {first.label.split(', seed')[0]} |"))
    assert f"| 2 of {len(same)} | 61.00 ± 1.41 | 61.00 ± 1.41 | 2.0 ± 0.0 |" in row


def test_the_plan_of_docs_experiments_is_the_example_file_and_expands_to_its_runs():
    page = (ROOT / "docs" / "experiments.md").read_text()
    example = ROOT / "experiments" / "examples" / "weight-decay.yaml"
    (shown,) = re.findall(r"```yaml\n(.*?)```", page, re.S)
    assert shown == example.read_text()
    plan = plans.load(example)
    assert len(plan.runs) == 9 == 3 * 3 and "its 9 runs" in page
    assert plan.runs[-1].args == ("--config", "cpu", "--model.optimizer.weight_decay", "0.025")
    assert plan.runs[-1].owned()[:4] == ("--seed_everything", "2", "--trainer.max_time", "00:00:07:40")


def test_a_run_that_stops_where_it_resumes_ends_the_plan_with_exit_4_unless_minutes_asked_for_it(tmp_path, fake_cifar):
    """vit-train's exit 4 (a signal, a time limit): without --minutes the plan stops and says the same
    command continues; with --minutes (commands bounded on purpose) the next command continues the run."""
    plan = plans.load(tiny_plan(tmp_path / "grid.yaml"))
    started = []

    def stopped(jobs, k=0):
        started.append([job.name for job in jobs])
        return [plans.STOPPED] * len(jobs)

    runner = plans.Runner(fake_cifar, tmp_path / "runs", check_command=ArgumentCheck())
    runner.train_at_once = stopped
    with pytest.raises(plans.PlanStopped, match="base-s0: vit-train stopped where it resumes"):
        runner.run_plan(plan)
    assert started == [["base-s0", "base-s1"]]
    bounded = plans.Runner(fake_cifar, tmp_path / "runs", minutes=5, max_commands=3, check_command=ArgumentCheck())
    bounded.train_at_once = stopped
    assert bounded.run_plan(plan) is False and started[1:] == [["base-s0", "base-s1"]] * 3


def test_an_array_task_runs_its_own_run_and_requeues_itself_when_the_run_stopped_where_it_resumes(tmp_path, capsys):
    """The generated script as SLURM runs it, with srun and scontrol stood in for: task 1 runs the plan's run 1
    in one step; its exit 4 (SIGUSR1 before a time limit) requeues the task, up to a bound."""
    plan = write(tmp_path / "two.yaml", "args: [--config, smoke]\nruns: [{name: a}, {name: b}]\n")
    assert main(["submit", str(plan), "--runs", str(tmp_path / "runs"), "--dry-run"]) == 0
    capsys.readouterr()
    script = tmp_path / "runs" / "two" / "two.sbatch"
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    write(bin_ / "srun", f'#!/bin/bash\necho "$WANDB_RUN_GROUP $*" > {tmp_path}/srun.$SLURM_ARRAY_TASK_ID\n'
                         f'echo "$VIT_REQUEUER" > {tmp_path}/requeuer\nkill -USR1 $PPID\nexit 4\n')
    write(bin_ / "scontrol", f'#!/bin/bash\necho "$*" >> {tmp_path}/scontrol\n')
    for tool in ("srun", "scontrol"):
        (bin_ / tool).chmod(0o755)

    def task(i: int, restarts: int = 0) -> subprocess.CompletedProcess:
        env = {"PATH": f"{bin_}:{os.environ['PATH']}", "SLURM_ARRAY_TASK_ID": str(i), "SLURM_JOB_ID": f"7{i}",
               "SLURM_RESTART_COUNT": str(restarts)}
        return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)

    first = task(1)
    assert first.returncode == 4 and "requeueing task 1 (job 71)" in first.stdout
    group, *command = (tmp_path / "srun.1").read_text().split()
    assert group == "two" and command[command.index("--run") + 1] == "b" and not (tmp_path / "srun.0").exists()
    assert (tmp_path / "scontrol").read_text() == "requeue 71\n"  # (its shell signalled too: `scancel --full`)
    assert (tmp_path / "requeuer").read_text() == "the job array of two.yaml (vit-plan submit)\n"  # the stop line's
    last = task(1, restarts=20)
    assert last.returncode == 4 and "not requeueing task 1: requeued 20 times" in last.stdout
    assert (tmp_path / "scontrol").read_text() == "requeue 71\n"
    beyond = task(2)
    assert beyond.returncode == 2 and "task 2: two.yaml has runs 0 to 1" in beyond.stderr


def git(*args, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_a_commits_checkout_is_made_whole_under_runs_checkouts_linked_to_its_recipes_and_reused(tmp_path, monkeypatch):
    """A run's ``commit:`` is a clone of this repository (a temporary one here) at that commit, made in a
    sibling folder and moved into place when complete (a clone cut short is never used), its configs/ linked
    as vit/configs; the next run of the commit reuses it; a commit the clone lacks is one line."""
    repo = tmp_path / "repo"
    (repo / "vit").mkdir(parents=True)
    (repo / "configs").mkdir()
    write(repo / "vit" / "__init__.py", "")
    write(repo / "configs" / "cpu.yaml", "old: 1\n")
    git("init", "--quiet", cwd=repo)
    git("add", ".", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "--quiet", "-m", "old", cwd=repo)
    old = git("rev-parse", "HEAD", cwd=repo)
    write(repo / "configs" / "cpu.yaml", "new: 1\n")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "--quiet", "-am", "new", cwd=repo)
    monkeypatch.setattr(plans.inputs, "REPO", repo)
    runner = plans.Runner(tmp_path / "data", tmp_path / "runs", check_command=ArgumentCheck())
    stale = tmp_path / "runs" / ".checkouts" / f"{old[:7]}.part-{os.getpid()}"  # a clone cut short before
    (stale / "vit").mkdir(parents=True)
    tree = runner.tree(plans.Run("t", "a", "a", (), commit=old))
    assert tree == tmp_path / "runs" / ".checkouts" / old[:7] and not stale.exists()
    assert (tree / "vit" / "configs" / "cpu.yaml").read_text() == "old: 1\n"  # its recipes, as its package's
    assert git("rev-parse", "HEAD", cwd=tree) == old
    from vit.training import commits
    assert commits.tree(tree) == ({"commit": old, "dirty": False}, None)  # its link is not a change to its code
    write(tree / "marker", "")
    assert runner.tree(plans.Run("t", "b", "b", (), commit=old)) == tree and (tree / "marker").exists()
    with pytest.raises(plans.PlanFailed, match=r"t/c runs commit 0{40}, which this clone does not have") as e:
        runner.tree(plans.Run("t", "c", "c", (), commit="0" * 40))
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in (tmp_path / "runs" / ".checkouts").iterdir()) == [old[:7]]


def test_a_benchmark_task_has_its_reports_folder_and_one_srun_task_and_a_task_with_a_record_is_not_rerun(tmp_path, capsys):
    plan = write(tmp_path / "two.yaml", "args: [--config, smoke]\nresources: {gpus: 2}\n"
                                         "runs: [{name: a}, {name: speed, benchmark: [--sections, step]}]\n")
    assert main(["submit", str(plan), "--runs", str(tmp_path / "runs"), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "#SBATCH --ntasks-per-node=2" in text and not (tmp_path / "runs" / "benchmark-two").exists()
    (arm,) = [line for line in text.splitlines() if line.startswith("  1) ")]
    assert "srun --ntasks=1 " in arm and f"--output {tmp_path}/runs/benchmark-two/speed.json" in arm
    assert f"mkdir -p {tmp_path}/runs/benchmark-two && " in arm  # the task makes its report's folder
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    write(bin_ / "srun", f"#!/bin/bash\ntouch {tmp_path}/srun.$SLURM_ARRAY_TASK_ID\n")
    (bin_ / "srun").chmod(0o755)
    (tmp_path / "runs" / "benchmark-two").mkdir()
    write(tmp_path / "runs" / "benchmark-two" / "speed.json", "{}")
    (tmp_path / "runs" / "two" / "a").mkdir(parents=True)
    write(tmp_path / "runs" / "two" / "a" / "results.json", "{}")
    for i in (0, 1):  # submitted again: each task's record exists, and it says so
        env = {"PATH": f"{bin_}:{os.environ['PATH']}", "SLURM_ARRAY_TASK_ID": str(i), "SLURM_JOB_ID": "7"}
        done = subprocess.run(["bash", str(tmp_path / "runs" / "two" / "two.sbatch")], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0 and ": done, its record is " in done.stdout, done.stderr
        assert not (tmp_path / f"srun.{i}").exists()


def test_submit_dry_run_writes_only_the_script_no_checkout_no_data(tmp_path, capsys, monkeypatch):
    """`submit --dry-run` names a commit's checkout, Fashion-MNIST's folders and a benchmark's report folder where
    the tasks will find them, and makes none of them: the script (in its folder) is the only thing written."""
    import vit.data.cifar
    import vit.data.folders

    def fetch(*args, **kwargs):
        raise AssertionError("--dry-run fetched or converted data")

    monkeypatch.setattr(vit.data.folders, "fashion_mnist_folders", fetch)
    monkeypatch.setattr(vit.data.cifar, "download", fetch)
    head = git("rev-parse", "HEAD", cwd=ROOT)
    plan = write(tmp_path / "all.yaml", f"""args: [--config, smoke]
runs:
  - {{name: here}}
  - {{name: fashion, data: fashion-mnist}}
  - {{name: then, commit: {head}}}
  - {{name: speed, benchmark: [--sections, step]}}
""")
    runs, data = tmp_path / "runs", tmp_path / "data"
    assert main(["submit", str(plan), "--runs", str(runs), "--data-root", str(data), "--dry-run"]) == 0
    text = capsys.readouterr().out
    made = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert made == ["all.yaml", "runs", "runs/all", "runs/all/all.sbatch"]
    arms = {line.split(")")[0].strip(): line for line in text.splitlines() if re.match(r"  \d\) ", line)}
    assert f"--data.root {data}/fashion-mnist-folders " in arms["1"]
    checkout = runs / ".checkouts" / head[:7]
    assert f"cd {checkout} && PYTHONPATH={checkout}" in arms["2"] and f"{checkout}/scripts/train.py " in arms["2"]
    assert f"mkdir -p {runs}/benchmark-all && " in arms["3"]


def test_runs_at_once_are_refused_beyond_this_processes_cores_or_with_gpus_and_each_gets_one_thread(tmp_path, capsys,
                                                                                                   fake_cifar, monkeypatch):
    cores = len(os.sched_getaffinity(0))
    many = write(tmp_path / "many.yaml", f"args: [--config, smoke]\nresources: {{at_once: {cores + 1}}}\nruns: [{{name: a}}]\n")
    assert main(["run", str(many), "--runs", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert f"resources.at_once {cores + 1}: this process may use {cores} CPU core(s)" in err and err.count("\n") == 1
    gpus = write(tmp_path / "gpus.yaml", "args: [--config, smoke]\nresources: {gpus: 1, at_once: 2}\nruns: [{name: a}]\n")
    assert main(["run", str(gpus), "--runs", str(tmp_path / "runs")]) == 2
    assert "at_once 2 with gpus 1" in capsys.readouterr().err and not (tmp_path / "runs").exists()
    if cores < 2:
        pytest.skip("runs at once need two CPU cores")
    started = []

    class Started:
        def __init__(self, command, env, preexec_fn, cwd, start_new_session):
            started.append((env.get("OMP_NUM_THREADS"), preexec_fn is not None))

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(plans.run_here.subprocess, "Popen", Started)
    three = write(tmp_path / "three.yaml", "args: [--config, smoke]\nseeds: [0, 1, 2]\nresources: {at_once: 2}\n"
                                           "runs: [{name: a}]\n")
    assert plans.Runner(fake_cifar, tmp_path / "runs", check_command=ArgumentCheck()).run_plan(plans.load(three))
    assert started == [("1", True)] * 3  # the last group's run alone too: one core, one thread


def test_missing_cifar_is_fetched_once_before_any_run_and_a_failed_fetch_is_one_line(tmp_path, capsys, monkeypatch):
    from vit.data import cifar
    from vit.exits import DatasetError

    def offline(root, *args):
        raise DatasetError("no network")

    monkeypatch.setattr(cifar, "download", offline)
    plan = write(tmp_path / "one.yaml", "args: [--config, smoke]\nruns: [{name: a}]\n")
    assert main(["run", str(plan), "--runs", str(tmp_path / "runs"), "--data-root", str(tmp_path / "data")]) == 1
    err = capsys.readouterr().err
    assert "CIFAR-10 is not in" in err and "run `make data`" in err and err.count("\n") == 1
    assert not (tmp_path / "runs" / "one").exists()
    fetched = []
    monkeypatch.setattr(cifar, "download", lambda root, *args: fetched.append(cifar.write_fake(root)))
    runner = plans.Runner(tmp_path / "data", tmp_path / "runs", check_command=ArgumentCheck())
    runner.train_at_once = lambda jobs, k=0: [plans.STOPPED] * len(jobs)
    with pytest.raises(plans.PlanStopped):
        runner.run_plan(plans.load(plan))
    runner.cifar(plans.load(plan))
    assert fetched == [tmp_path / "data"]  # once


# A user's recipe file, as `vit-train --print_config` writes one: its own seed, budget and data.
MINE = """seed_everything: 5
trainer:
  max_time: "00:00:42:00"
data:
  class_path: {data}
  init_args:
    root: /elsewhere
    batch_size: 64
"""


def print_config(words: list[str], capsys) -> dict:
    """vit-train's parsed configuration of a command line (--print_config), in this process."""
    import yaml

    from vit.commands import train

    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        train.main([*words, "--print_config"])
    assert done.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("plan_keys", [True, False], ids=["plan-seeds-minutes", "recipe-seeds-minutes"])
@pytest.mark.parametrize("data", ["cifar", "fashion-mnist"])
@pytest.mark.parametrize("recipe", ["name", "file"])
def test_a_run_is_what_show_prints_and_the_plans_seed_budget_and_data_win_over_any_recipe(tmp_path, capsys, recipe,
                                                                                          data, plan_keys):
    """Plans with a recipe by name or as a file carrying seed_everything, max_time and data settings (the other
    data module, another root), seeds and minutes from the plan, the run or neither, each data value: every
    run's configuration as vit-train parses the very command `show` prints holds the plan's seed, budget, data
    module and root, the recipe's where the plan gives none, and the recipe's other settings."""
    other = {"cifar": "vit.data.ImageFolderDataModule", "fashion-mnist": "vit.data.CIFAR10DataModule"}[data]
    mine = write(tmp_path / "mine.yaml", MINE.format(data=other))
    first = ["--config", str(mine)] if recipe == "file" else ["--config", "cpu"]
    plan_path = write(tmp_path / "grid.yaml", f"""
args: {json.dumps(first)}
{"seeds: [1]" if plan_keys else ""}
{"minutes: 3" if plan_keys else ""}
runs:
  - {{name: a, data: {data}}}
  - {{name: b, data: {data}, seeds: [7], minutes: 0.5, args: [--config, {mine}, --model.arch.depth, "1"]}}
""")
    runs, root = tmp_path / "runs", tmp_path / "data"
    assert main(["show", str(plan_path), "--runs", str(runs), "--data-root", str(root)]) == 0
    shown = [line.split(None, 1) for line in capsys.readouterr().out.splitlines() if line.startswith("      ")]
    plan = plans.load(plan_path)
    runner = plans.Runner(root, runs, check_command=ArgumentCheck())
    (root / "fashion-mnist-folders").mkdir(parents=True)  # (there: the command is made without fetching it)
    assert [program for program, _ in shown] == ["vit-train"] * len(plan.runs) == ["vit-train"] * (2)
    folder = root / "fashion-mnist-folders" if data == "fashion-mnist" else root
    recipe_seed, recipe_time = (5, "00:00:42:00") if recipe == "file" else (0, "00:00:10:00")
    for job, (_, line) in zip(plan.runs, shown):
        words = shlex.split(line)
        assert runner.train_command(job)[2:] == words  # `show`'s line is the command that runs
        config = print_config(words, capsys)
        trains = {m: plans.max_time(plans.plan_file.training_minutes(m)) for m in (3, 0.5)}  # (less the reserve)
        seed, budget = ((1, trains[3]) if plan_keys else (recipe_seed, recipe_time)) if job.change == "a" \
            else (7, trains[0.5])
        assert (config["seed_everything"], config["trainer"]["max_time"]) == (seed, budget), job.name
        assert config["data"]["class_path"] == plans.DATA[data] != other
        assert config["data"]["init_args"]["root"] == str(folder)
        assert "download" not in config["data"]["init_args"] or data == "cifar"
        if job.change == "b":  # its own args after the plan's
            assert config["model"]["arch"]["depth"] == 1
        if recipe == "file" or job.change == "b":  # the file's other data settings still hold
            assert config["data"]["init_args"]["batch_size"] == 64
        planned = runner.configuration(job)  # what the plan compares a record with: the same parse
        assert (planned["seed_everything"], planned["trainer.max_time"], planned["data.class_path"]) == \
            (seed, budget, plans.DATA[data])


@pytest.mark.parametrize("gpus, recipe", [(0, "cpu"), (1, "vit_cifar10")])
def test_a_run_without_a_recipe_trains_the_one_its_plan_gives_on_every_machine(tmp_path, capsys, monkeypatch, gpus,
                                                                               recipe):
    """A run that names no recipe trains the one its plan gives it: the default recipe where the plan gives each
    run GPUs (resources.gpus), else the cpu recipe, whatever machine shows, renders or runs the plan (with a GPU or
    without, VIT_ASSUME_GPU=1 or not). `show` names it in every command (said once, with why), the configuration a
    record is compared with is that recipe's, and the run's record counts in the table on either machine."""
    runs = tmp_path / "runs"
    plan = write(tmp_path / "bare.yaml", f"seeds: [0, 1, 2]\nresources: {{gpus: {gpus}}}\n"
                                         "runs: [{name: a}, {name: b, args: [--model.arch.depth, '2']}]\n")
    seen = []
    for here in (False, True):
        monkeypatch.setattr("vit.configs.gpu_present", lambda: here)
        if here:
            monkeypatch.setenv("VIT_ASSUME_GPU", "1")
        else:
            monkeypatch.delenv("VIT_ASSUME_GPU", raising=False)
        assert main(["show", str(plan), "--runs", str(runs)]) == 0
        out = capsys.readouterr().out
        commands = [line.split() for line in out.splitlines() if line.startswith("      vit-train ")]
        assert len(commands) == 6 and all(words[1:3] == ["--config", recipe] for words in commands)
        said = [line for line in out.splitlines() if line.startswith("[plan] runs that name no recipe")]
        assert said == [f"[plan] runs that name no recipe train {recipe} (--config {recipe}): " +
                        (f"the plan gives each {gpus} GPU(s) (resources.gpus)" if gpus else
                         "the plan gives them no GPU (resources.gpus is 0)") +
                        "; name a recipe in the plan's args to choose another"]
        check = ArgumentCheck()
        runner, other = (plans.Runner(tmp_path / "data", runs, check_command=check) for _ in range(2))
        named = write(tmp_path / "named.yaml", plan.read_text().replace("seeds:", f"args: [--config, {recipe}]\nseeds:"))
        for bare, explicit in zip(plans.load(plan).runs, plans.load(named).runs):
            assert runner.recipe(bare) == recipe
            assert runner.configuration(bare) == other.configuration(explicit)
            assert runner.configuration(bare)["model.arch.dim"] == (192 if recipe == "vit_cifar10" else 64)
        if not here:  # a record of run a, seed 0, written where no GPU is
            a0 = plans.load(plan).runs[0]
            (runs / "bare" / a0.name).mkdir(parents=True)
            write(runs / "bare" / a0.name / "results.json",
                  json.dumps({"test_top1": 50.0, "configuration": runner.configuration(a0)}))
        assert main(["table", str(plan), "--runs", str(runs)]) == 0
        table = capsys.readouterr().out
        assert "| a | the plan's | 1 of 3 | 50.00 |" in table and "left out" not in table, table
        seen.append((commands, table))
    assert seen[0] == seen[1]  # the same commands and the same table on both machines


@pytest.mark.long
def test_a_record_belongs_to_its_command_an_edited_plan_moves_the_old_aside_and_runs_again(tmp_path, capsys,
                                                                                          fake_cifar):
    """A plan run at toy scale, then its run's args edited (depth 1 → 2, the same name): its record is another
    command's, so the table leaves it out and says why, and `run` moves it aside (record and checkpoints, never
    deleted) with one line, runs it again, and says what it skips."""
    quick = [*TOY, "--trainer.logger", "false", "--trainer.max_epochs", "1"]
    plan = tmp_path / "edit.yaml"

    def plan_with(depth: int, b: str = "") -> Path:
        return write(plan, f"args: {json.dumps(quick)}\nruns:\n  - {{name: a, args: [--model.arch.depth, '{depth}']}}\n"
                           + b)

    where = ["--runs", str(tmp_path / "runs"), "--data-root", str(fake_cifar)]
    assert main(["run", str(plan_with(1)), *where]) == 0
    run = tmp_path / "runs" / "edit" / "a"
    first = json.loads((run / "results.json").read_text())
    assert first["configuration"]["model.arch.depth"] == 1 and first["configuration"]["seed_everything"] == 0
    # a second run whose record has its configuration (as vit-train writes it: not trained again here)
    plan_with(1, "  - {name: b, args: [--model.arch.depth, '1']}\n")
    b = plans.load(plan).runs[1]
    (run.parent / "b").mkdir()
    (run.parent / "b" / "results.json").write_text(json.dumps({**first, "configuration": plans.Runner(
        fake_cifar, tmp_path / "runs", check_command=ArgumentCheck()).configuration(b)}))
    capsys.readouterr()
    assert main(["run", str(plan), *where]) == 0
    assert "[plan] 2 of 2 runs have their records: nothing to run" in capsys.readouterr().out
    plan_with(2, "  - {name: b, args: [--model.arch.depth, '1']}\n")
    assert main(["table", str(plan), "--runs", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "| a | `--model.arch.depth 2` | 0 of 1 | pending |" in out and "| b | `--model.arch.depth 1` | 1 of 1 |" in out
    assert "1 record(s) left out, of another command than the plan's run now (a; a: model.arch.depth 1 → 2)" in out
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert main(["run", str(plan), *where]) == 0
    out = capsys.readouterr().out
    aside = run.with_name("a.replaced-1")
    assert f"[plan] edit/a: its record is of another command (model.arch.depth 1 → 2): moved aside to {aside}; " \
           "it runs again" in out
    assert "[plan] 1 of 2 runs have their records: those are skipped" in out and "--run b " not in out
    assert json.loads((aside / "results.json").read_text()) == first  # kept whole, with its checkpoints
    assert sorted(p.name for p in (aside / "checkpoints").iterdir()) == checkpoints
    second = json.loads((run / "results.json").read_text())
    assert second["configuration"]["model.arch.depth"] == 2 and "--model.arch.depth 2" in second["command"]
    assert main(["table", str(plan), "--runs", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "| a | `--model.arch.depth 2` | 1 of 1 |" in out and "left out" not in out


def test_submit_moves_a_record_of_another_command_aside_and_the_table_leaves_it_out(tmp_path, capsys, fake_cifar,
                                                                                   monkeypatch):
    """Without training: one run's record has the plan's configuration, the other's another depth. The table
    counts only the first and says why; submit moves the other's folder aside (whole) with one line, before
    sbatch, so that its task runs it again. A record without a configuration (one from before records kept it)
    is not known to be the run's: left out and run again the same way."""
    plan_path = write(tmp_path / "two.yaml", "args: [--config, smoke]\nseeds: [0]\n"
                                             "runs: [{name: a}, {name: b, args: [--model.arch.depth, '2']}, {name: c}]\n")
    plan = plans.load(plan_path)
    runs = tmp_path / "runs"
    runner = plans.Runner(fake_cifar, runs, check_command=ArgumentCheck())
    a, b, c = plan.runs
    wrong = {**runner.configuration(b), "model.arch.depth": 1}
    for job, record in ((a, {"configuration": runner.configuration(a)}), (b, {"configuration": wrong}), (c, {})):
        (runs / "two" / job.name / "checkpoints").mkdir(parents=True)
        (runs / "two" / job.name / "results.json").write_text(json.dumps({"test_top1": 50.0, **record}))
    assert main(["table", str(plan_path), "--runs", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "| a | the plan's | 1 of 1 | 50.00 |" in out and "| c | the plan's | 0 of 1 | pending |" in out
    assert "| b | `--model.arch.depth 2` | 0 of 1 | pending |" in out
    assert "2 record(s) left out, of another command than the plan's run now (b-s0, c-s0; b-s0: model.arch.depth 1 " \
           "→ 2)" in out
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    write(bin_ / "sbatch", "#!/bin/bash\necho 123\n").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    assert main(["submit", str(plan_path), "--runs", str(runs), "--data-root", str(fake_cifar)]) == 0
    out = capsys.readouterr().out
    aside = runs / "two" / "b-s0.replaced-1"
    assert f"[plan] two/b-s0: its record is of another command (model.arch.depth 1 → 2): moved aside to {aside}; " \
           "it runs again" in out and "[plan] 1 of 3 runs have their records: those are skipped" in out
    assert f"[plan] two/c-s0: its record is of another command (configuration: not recorded): moved aside to " \
           f"{runs / 'two' / 'c-s0.replaced-1'}; it runs again" in out
    assert (aside / "checkpoints").is_dir() and json.loads((aside / "results.json").read_text())["configuration"] == wrong
    # b-s0 starts anew: its folder holds only what the plan starts it with (plan.json), a-s0 keeps its record
    assert sorted(p.name for p in (runs / "two" / "b-s0").iterdir()) == ["plan.json"]
    assert (runs / "two" / "a-s0" / "results.json").is_file()


def test_with_a_results_folder_a_copy_of_another_command_moves_aside_and_a_committed_record_stays(tmp_path, capsys):
    """make figures' layout (records copied to RESULTS/TABLE/NAME.json): a copy of another configuration moves
    aside with its run folder, and so does one without a configuration (from before records kept it)."""
    plan = plans.load(write(tmp_path / "t.yaml", "args: [--config, smoke]\nruns: [{name: a}, {name: b}]\n"))
    runner = plans.Runner(tmp_path / "data", tmp_path / "runs", tmp_path / "results", check_command=ArgumentCheck())
    a, b = plan.runs
    (tmp_path / "results" / "t").mkdir(parents=True)
    write(tmp_path / "results" / "t" / "a.json", json.dumps({"row": "a", "configuration": {
        **runner.configuration(a), "seed_everything": 9}}))
    write(tmp_path / "results" / "t" / "b.json", json.dumps({"row": "b", "command": "vit-train --config smoke"}))
    (tmp_path / "runs" / "t" / "a" / "checkpoints").mkdir(parents=True)
    write(tmp_path / "results" / "t" / "b.json", json.dumps({"row": "b", "configuration": runner.configuration(b)}))
    assert runner.settle([a, b]) == 1
    out = capsys.readouterr().out
    assert f"moved aside to {tmp_path}/results/t/a.replaced-1.json, {tmp_path}/runs/t/a.replaced-1; it runs again" in out
    assert "(seed_everything 9 → 0)" in out and "[plan] 1 of 2 runs have their records: those are skipped" in out
    assert (tmp_path / "results" / "t" / "b.json").is_file() and not (tmp_path / "results" / "t" / "a.json").exists()
    write(tmp_path / "results" / "t" / "b.json", json.dumps({"row": "b", "command": "vit-train --config smoke"}))
    assert runner.settle([a, b]) == 0
    assert f"[plan] t/b: its record is of another command (configuration: not recorded): moved aside to " \
           f"{tmp_path}/results/t/b.replaced-1.json; it runs again" in capsys.readouterr().out
    assert (tmp_path / "runs" / "t" / "a.replaced-1" / "checkpoints").is_dir()


def test_a_run_started_under_another_command_moves_aside_and_one_still_training_is_refused(tmp_path, fake_cifar,
                                                                                           capsys):
    """A run the plan started (stopped before its record) whose plan was edited since: its folder, checkpoints
    included, moves aside and it runs again; while a process still trains in it, one line refuses."""
    import subprocess
    import sys

    plan = write(tmp_path / "edit.yaml", "args: [--config, smoke]\nruns: [{name: a, args: [--model.arch.depth, '1']}]\n")
    folder = tmp_path / "runs" / "edit" / "a"
    runner = plans.Runner(fake_cifar, tmp_path / "runs", check_command=ArgumentCheck())
    (a,) = plans.load(plan).runs
    runner.remember(a)
    (folder / "checkpoints").mkdir()
    assert runner.settle([a]) == 0 and folder.is_dir()  # the same command: it continues
    write(plan, "args: [--config, smoke]\nruns: [{name: a, args: [--model.arch.depth, '2']}]\n")
    (a,) = plans.load(plan).runs
    hold = ("import sys, time; from pathlib import Path; from vit.cluster import run_lock; run_lock.take(Path(sys.argv[1])); "
            "print('held', flush=True); time.sleep(300)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        edited = plans.Runner(fake_cifar, tmp_path / "runs", check_command=ArgumentCheck())
        with pytest.raises(plans.PlanFailed, match=r"edit/a still trains under another command than the plan's now "
                                                   r"\(model.arch.depth 1 → 2\)"):
            edited.settle([a])
    finally:
        holder.kill()
        holder.wait()
    capsys.readouterr()
    assert edited.settle([a]) == 0 and not folder.exists()
    assert (tmp_path / "runs" / "edit" / "a.replaced-1" / "checkpoints").is_dir()
    assert "edit/a: it was started under another command (model.arch.depth 1 → 2)" in capsys.readouterr().out


@pytest.mark.long
def test_a_plan_submitted_without_a_gpu_and_trained_on_one_is_done_once(tmp_path, capsys, fake_cifar, monkeypatch):
    """A plan whose run names no recipe, with resources.gpus 1, submitted from a login node without a GPU; its
    task trains where vit-train chooses as on a GPU machine (VIT_ASSUME_GPU=1; toy options for the CPU). The
    record is of the run the plan has (the table counts it) and the next submit leaves it be."""
    monkeypatch.delenv("VIT_ASSUME_GPU", raising=False)
    monkeypatch.setattr("vit.configs.gpu_present", lambda: False)
    toy = [*plans.QUICK_TRAIN, "--trainer.max_epochs", "1", "--trainer.logger", "false"]
    plan = write(tmp_path / "gpu.yaml", f"args: {json.dumps(toy)}\nresources: {{gpus: 1}}\nruns: [{{name: a}}]\n")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    write(bin_ / "srun", '#!/bin/bash\nexec "$@"\n').chmod(0o755)  # the task's step: the command itself
    write(bin_ / "sbatch", f'#!/bin/bash\nVIT_ASSUME_GPU=1 SLURM_ARRAY_TASK_ID=0 SLURM_JOB_ID=7 bash "$2" '
                           f'>> {tmp_path}/task.log 2>&1\necho 7\n').chmod(0o755)  # the task, on a "GPU node"
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    where = ["--runs", str(tmp_path / "runs"), "--data-root", str(fake_cifar)]
    assert main(["submit", str(plan), *where]) == 0
    record = json.loads((tmp_path / "runs" / "gpu" / "a" / "results.json").read_text())
    assert record["recipe"] == "vit_cifar10", (tmp_path / "task.log").read_text()[-2000:]  # the GPU node's choice
    capsys.readouterr()
    assert main(["table", str(plan), "--runs", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "| a | the plan's | 1 of 1 |" in out and "left out" not in out, out
    assert "--config vit_cifar10 " in record["command"]  # the plan named it in the task's command
    assert main(["submit", str(plan), *where]) == 0
    out = capsys.readouterr().out
    assert "[plan] 1 of 1 runs have their records: nothing to run" in out and "moved aside" not in out
    assert "gpu/a: done, its record is" in (tmp_path / "task.log").read_text()
    assert json.loads((tmp_path / "runs" / "gpu" / "a" / "results.json").read_text()) == record
    assert sorted(p.name for p in (tmp_path / "runs" / "gpu").iterdir() if p.is_dir()) == ["a"]


def test_a_commits_run_and_a_benchmark_are_compared_by_their_command(tmp_path, capsys):
    """Records of a run of another commit and of a benchmark, written by the commands the plan starts (their
    paths elsewhere, the options in another order, a section under its earlier name): done. Their args edited
    in the plan, the same records are another command's: the table leaves the run out, `run` moves both aside
    and says what differs. A record without a command is not known to be its run's: it runs again."""
    def plan_with(extra: str, sections: str) -> plans.Plan:
        return plans.load(write(tmp_path / "t.yaml", f"""args: [--config, smoke]
runs:
  - {{name: then, commit: abcdef0, seeds: [3], args: [--model.arch.depth, '2'{extra}]}}
  - {{name: speed, benchmark: [--device, cpu, --sections, "{sections}"]}}
  - {{name: old, commit: abcdef0}}
"""))
    runner = plans.Runner(tmp_path / "data", tmp_path / "runs", check_command=ArgumentCheck())
    then, speed, old = plan_with("", "fast-paths,step").runs
    (tmp_path / "runs" / "t" / "then-s3").mkdir(parents=True)
    write(tmp_path / "runs" / "t" / "then-s3" / "results.json", json.dumps({"test_top1": 50.0, "command": (
        "python scripts/train.py --config smoke --model.arch.depth=2 --data.root /elsewhere --seed_everything 3 "
        "--trainer.default_root_dir /x --run then-s3 --ckpt_path last --stop_after_minutes 9")}))
    (tmp_path / "runs" / "benchmark-t").mkdir(parents=True)
    write(tmp_path / "runs" / "benchmark-t" / "speed.json", json.dumps({"command": (
        "vit-benchmark --sections levers,step --device cpu --output /y/speed.json --minutes 3")}))
    (tmp_path / "runs" / "t" / "old").mkdir(parents=True)
    write(tmp_path / "runs" / "t" / "old" / "results.json", json.dumps({"test_top1": 40.0}))
    assert [runner.differences(job) for job in (then, speed, old)] == [[], [], ["command: not recorded"]]
    assert runner.settle([then, speed, old]) == 2
    assert "[plan] t/old: its record is of another command (command: not recorded): moved aside" in capsys.readouterr().out
    then, speed, old = plan_with(", --model.ema_decay, '0.9'", "step").runs
    edited = plans.Runner(tmp_path / "data", tmp_path / "runs", check_command=ArgumentCheck())
    assert main(["table", str(tmp_path / "t.yaml"), "--runs", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "| then | `--model.arch.depth 2 --model.ema_decay 0.9` (commit abcdef0) | 0 of 1 | pending |" in out
    assert "(then-s3; then-s3: --model.ema_decay (none) → 0.9)" in out, out
    assert edited.settle([then, speed, old]) == 0
    out = capsys.readouterr().out
    assert f"[plan] t/then-s3: its record is of another command (--model.ema_decay (none) → 0.9): moved aside to " \
           f"{tmp_path}/runs/t/then-s3.replaced-1; it runs again" in out
    assert f"[plan] benchmark-t/speed: its record is of another command (--sections fast-paths,step → step): moved " \
           f"aside to {tmp_path}/runs/benchmark-t/speed.replaced-1.json; it runs again" in out
    # what the plan starts a commit's run with is its command: a later edit moves the stopped run aside too
    edited.remember(then)
    assert edited.started_differences(then) == []
    assert runner.started_differences(plan_with("", "step").runs[0]) == ["--model.ema_decay 0.9 → (none)"]


def test_a_committed_record_shows_in_a_table_only_where_it_is_of_its_plans_run_today():
    """A record satisfies its row only when it keeps what made it (a training run's configuration; a benchmark's
    or another commit's run's command) and that is its plan's run today: the gpu plan's committed records (the
    fast recipe's, without a configuration; the eager benchmark's, of other sections and batches) satisfy none,
    so README's GPU rows are pending and `make figures` runs them again."""
    runner = plans.Runner(ROOT / "data", ROOT / "runs", ROOT / "results", check_command=ArgumentCheck())
    gpu = plans.load(plans.find("gpu"))
    committed = [job for job in gpu.runs if runner.record_path(job).is_file()]
    assert {job.name for job in committed} >= {"01-vit_cifar10_fast", "gpu"}
    assert all(runner.differences(job) for job in committed)
    assert runner.differences(next(job for job in committed if job.name == "01-vit_cifar10_fast")) == \
        ["configuration: not recorded"]
    block = next(m["body"] for m in tables.BLOCK.finditer((ROOT / "README.md").read_text()) if m["table"] == "gpu")
    rows = [line for line in block.splitlines() if line.startswith("| vit_cifar10")]
    assert "results/gpu/" not in block and len(rows) == 2 and all(row.count(" pending ") == 6 for row in rows)
