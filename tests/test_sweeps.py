"""W&B Sweeps: the sweep agent's own code (wandb's Agent, its process start replaced by a recorder) writes
vit-train's command line from a sweep's parameters, with each of its macros — ${args} (``--key=str(value)``:
Python's None, True, nested lists), ${args_json} (one JSON mapping) and ${args_json_file} (its file) —
and vit-train reads each as the values the sweep meant (docs/sweeps.md). No network, no sweep server."""

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import ROOT, TEST_LINE, errors_of, load

# The options a sweep sets here, by what they are (the one place their names are written)
OPTIONS = {
    "ema": "model.ema_decay",  # float | None
    "stages": "model.schedule.resize_stages",  # pairs: a nested list
    "compile": "model.compile",  # bool
    "lr": "model.optimizer.lr",  # float
    "optimizer": "model.optimizer.name",  # a choice of strings
    "dim": "model.arch.dim",  # int, two levels down
    "hflip": "data.hflip",  # bool, of the data module's (subclass) options
    "pretrained": "model.pretrained",  # str | None
}
# Two runs a grid over these values starts: the first with Python's None, False and a nested list, the
# second with a float in place of None, True and an empty list; each value as the sweep's server sends it
# (the sweep file's null is Python's None)
RUNS = [
    {"ema": None, "stages": [[16, 0.25], [24, 0.5]], "compile": False, "lr": 0.001, "optimizer": "adamw",
     "dim": 32, "hflip": False, "pretrained": None},
    {"ema": 0.999, "stages": [], "compile": True, "lr": 1e-05, "optimizer": "muon", "dim": 48, "hflip": True,
     "pretrained": None},
]
SWEEP = {"program": "scripts/train.py", "method": "grid", "metric": {"name": "val/acc", "goal": "maximize"},
         "parameters": {OPTIONS[key]: {"values": [run[key] for run in RUNS]} for key in OPTIONS}}
PREFIX = ["${env}", "${interpreter}", "${program}", "--config", "smoke"]
COMMANDS = {  # the sweep's `command:`, one per macro
    "args": [*PREFIX, "${args}"],
    "args_json": [*PREFIX, "--config", "${args_json}"],
    "args_json_file": [*PREFIX, "--config", "${args_json_file}"],
}


def agent_command(command: list[str], values: dict, tmp_path: Path, monkeypatch) -> tuple[list[str], dict]:
    """The command line and environment the W&B agent starts a run of this sweep with (``values``: the
    parameters' values the server chose), built by the agent's own code."""
    from wandb import wandb_agent

    started = []

    class Recorder:  # the agent's AgentProcess, which would start the command
        def __init__(self, env=None, command=None, **kwargs):
            started.append((command, env))

    monkeypatch.setattr(wandb_agent, "AgentProcess", Recorder)
    for name, value in (("WANDB_DIR", str(tmp_path)), ("WANDB_SWEEP_ID", "sweep7"), ("WANDB_RUN_ID", ""),
                        ("WANDB_SWEEP_PARAM_PATH", "")):
        monkeypatch.setenv(name, value)  # (the agent sets the last two: put back after the test)
    agent = wandb_agent.Agent(api=None, queue=None, sweep_id="sweep7")
    agent._sweep_command = command  # as the agent's own setup sets it from the sweep's config
    agent._command_run({"type": "run", "run_id": "run3", "program": str(ROOT / "scripts" / "train.py"),
                        "args": {name: {"value": value} for name, value in values.items()}})
    ((line, env),) = started
    return line, env


def chosen(run: dict) -> dict:
    """A run's parameters as the sweep's server sends them: the sweep's values, under the options' names."""
    values = {name: spec["values"][RUNS.index(run)] for name, spec in SWEEP["parameters"].items()}
    assert values == {OPTIONS[key]: value for key, value in run.items()}
    return values


def printed_config(argv: list[str]) -> dict:
    """vit-train's --print_config for ``argv``, in this process (parse only: nothing trains)."""
    from vit.commands.train import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as end:
        main([*argv, "--print_config"])
    assert end.value.code in (0, None), out.getvalue()
    return yaml.safe_load(out.getvalue())


def value_at(config: dict, dotted: str):
    """``model.arch.dim`` of a printed config (a data module's options are under its init_args)."""
    for key in dotted.split("."):
        config = config[key] if key in config else config["init_args"][key]
    return config


@pytest.mark.parametrize("macro", list(COMMANDS))
@pytest.mark.parametrize("run", RUNS, ids=["none-false-nested", "floats-true-empty"])
def test_the_agents_command_gives_the_sweeps_values(macro, run, tmp_path, monkeypatch):
    line, _ = agent_command(COMMANDS[macro], chosen(run), tmp_path, monkeypatch)
    assert line[:3] == ["/usr/bin/env", "python", str(ROOT / "scripts" / "train.py")]
    if macro == "args":  # what the agent writes: Python's str() of each value
        assert f"--{OPTIONS['ema']}={run['ema']}" in line and f"--{OPTIONS['stages']}={run['stages']}" in line
    else:
        assert len(line) == 7  # one argument holds every value
    config = printed_config(line[3:])
    for key, value in run.items():
        assert value_at(config, OPTIONS[key]) == value, (key, line)
    assert value_at(config, "model.arch.depth") == 4  # the smoke recipe's, under the sweep's values


@pytest.mark.parametrize("macro", ["args", "args_json"])
def test_a_bad_value_from_a_sweep_is_one_line_and_exit_2(macro, tmp_path, monkeypatch, capsys):
    from vit.commands.train import main

    values = {**chosen(RUNS[0]), OPTIONS["ema"]: 1.5}
    line, _ = agent_command(COMMANDS[macro], values, tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert main(line[3:]) == 2
    (error,) = errors_of(capsys)
    assert OPTIONS["ema"] in error and "v>0 and v<1" in error  # the option and what it takes
    assert not (tmp_path / "runs").exists()  # refused before any work


@pytest.mark.long
def test_a_sweep_run_trains_end_to_end(tmp_path, fake_cifar_session, monkeypatch):
    """The agent's ${args} command as it starts it: `/usr/bin/env python scripts/train.py ...` in the
    agent's environment, with the venv's python first on PATH, as an activated venv has it (progress bar
    and W&B on: offline, without credentials)."""
    values = {**chosen(RUNS[0]), "data.root": str(fake_cifar_session), "data.val_size": 100,
              "data.num_workers": 0, "data.batch_size": 50, "trainer.max_epochs": 1, "test_after_fit": False}
    line, env = agent_command(COMMANDS["args"], values, tmp_path, monkeypatch)
    assert "--test_after_fit=False" in line
    env = {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"}
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_SERVICE", "WANDB_SILENT"):
        env.pop(name, None)
    proc = subprocess.run(line, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "runs" / "smoke" / "version_0"
    saved = yaml.safe_load((run / "config.yaml").read_text())
    for key, value in RUNS[0].items():
        assert value_at(saved, OPTIONS[key]) == value, key
    assert "training on 16-px images" in proc.stderr and "training on 24-px images" in proc.stderr  # its stages
    assert load(run / "checkpoints" / "last.ckpt")["vit"]["config"]["dim"] == RUNS[0]["dim"]
    assert not re.search(TEST_LINE, proc.stderr)  # --test_after_fit=False: no test
    # the W&B run is the one the agent named, in the run folder and its checkpoints, and W&B says of no other
    assert (run / "wandb_id").read_text().strip() == "run3" and list((run / "wandb").glob("offline-run-*-run3"))
    assert load(run / "checkpoints" / "last.ckpt")["vit"]["wandb_run_id"] == "run3"
    assert "Ignoring" not in proc.stdout + proc.stderr


def docs_sweep() -> dict:
    """docs/sweeps.md's sweep file."""
    (text,) = re.findall(r"```yaml\n(# sweep\.yaml\n.*?)```", (ROOT / "docs" / "sweeps.md").read_text(), re.S)
    return yaml.safe_load(text)


def test_the_documented_sweep_gives_its_values(tmp_path, monkeypatch):
    """Every run of docs/sweeps.md's sweep that its values make (the first of each, then the last; a
    distribution's bounds) starts with the values the file says."""
    sweep = docs_sweep()
    assert sweep["program"] == "scripts/train.py" and sweep["command"][:3] == PREFIX[:3]
    assert "${args}" in sweep["command"]
    for pick in (0, -1):
        values = {name: spec["values"][pick] if "values" in spec else spec["min" if pick == 0 else "max"]
                  for name, spec in sweep["parameters"].items()}
        line, _ = agent_command(sweep["command"], values, tmp_path, monkeypatch)
        config = printed_config(line[3:])
        for name, value in values.items():
            assert value_at(config, name) == value, name
        monkeypatch.undo()


AGENTS = ROOT / "scripts" / "slurm" / "sweep_agents.sbatch"


def run_agents(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The sbatch script as SLURM runs array task 2, with a stand-in for the venv's wandb: its arguments and
    the python it would find, one line each."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / ".installed").write_text("SYSTEM_SITE= WHEELS=\n")
    calls = tmp_path / "wandb.calls"
    (venv / "bin" / "wandb").write_text(f'#!/bin/sh\necho "$@" >> {calls}\ncommand -v python >> {calls}\n')
    (venv / "bin" / "python").write_text("#!/bin/sh\n")
    for tool in (venv / "bin").iterdir():
        tool.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "VIT_", "WANDB_"))}
    env.update(SLURM_SUBMIT_DIR=str(tmp_path), SLURM_JOB_ID="81", SLURM_ARRAY_JOB_ID="80", SLURM_ARRAY_TASK_ID="2",
               SLURM_JOB_NODELIST="node1", VIT_VENV=str(venv))
    proc = subprocess.run(["bash", str(AGENTS), *args], env=env, capture_output=True, text=True, timeout=60)
    return proc, calls.read_text().splitlines() if calls.exists() else []


def test_each_array_task_is_one_agent_for_one_run(tmp_path):
    proc, calls = run_agents(tmp_path, "me/vit/abc123")
    assert proc.returncode == 0, proc.stderr
    assert calls == ["agent --count 1 me/vit/abc123", str(tmp_path / "venv" / "bin" / "python")]
    assert proc.stdout.startswith("sweep agent 80_2 on node1: ")


@pytest.mark.parametrize("args", [(), ("abc123",)])
def test_the_agents_script_refuses_a_sweep_without_its_path_in_one_line(args, tmp_path):
    proc, calls = run_agents(tmp_path, *args)
    assert proc.returncode == 2 and calls == [] and proc.stdout == ""
    assert proc.stderr == ("give the sweep as ENTITY/PROJECT/SWEEP_ID, as `wandb sweep` prints it: "
                           "sbatch scripts/slurm/sweep_agents.sbatch ENTITY/PROJECT/SWEEP_ID\n")


def test_the_agents_script_is_an_array_with_train_sbatchs_cluster_lines():
    text = AGENTS.read_text()
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    commented = [line.split("=")[0] for line in text.splitlines() if line.startswith("##SBATCH")]
    assert "#SBATCH --array=0-3" in directives and "#SBATCH --gpus-per-node=1" in directives
    assert commented == ["##SBATCH --partition", "##SBATCH --account", "##SBATCH --qos"]
    assert "`#SBATCH --gres=gpu:1`" in text


@pytest.mark.parametrize("settings", ['{"model.lr": 0.001}', '{"model": {"lr": 0.001}}', "file"])
def test_an_old_option_in_settings_given_to_config_says_where_it_is_now(settings, tmp_path, monkeypatch, capsys):
    """W&B's ${args_json} (and ${args_json_file}) of a sweep written for the flat options: one line, exit 2."""
    from vit.commands.train import main

    if settings == "file":
        (tmp_path / "args.json").write_text('{"model.lr": 0.001}')
        settings = str(tmp_path / "args.json")
    monkeypatch.chdir(tmp_path)
    assert main(["--config", "smoke", "--config", settings]) == 2
    (error,) = errors_of(capsys)
    assert "--model.lr" in error and "--model.optimizer.lr" in error
    assert not (tmp_path / "runs").exists()  # refused before any work
