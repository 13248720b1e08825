"""vit-sync: the W&B runs logged offline under a folder are uploaded with `wandb sync`, each once — against a
stand-in W&B server on 127.0.0.1 that answers what `wandb sync` asks (GraphQL, file uploads, the file stream)
and keeps what it was sent."""

import csv
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import SLURM_TASK, fake_wandb, sync_here, train

KEY = "0123456789abcdef0123456789abcdef01234567"  # (a stand-in's key: wandb checks its form, the server nothing)


@pytest.fixture
def wandb_server():
    with fake_wandb() as server:
        yield server


def environment(monkeypatch, server, home: Path, key: str | None = KEY) -> dict:
    """A login node's environment here: the stand-in server, ``key`` as the only credentials."""
    values = {"WANDB_BASE_URL": f"http://127.0.0.1:{server.server_port}", "HOME": str(home),
              "WANDB_CONFIG_DIR": str(home / "wandb-config"), "NETRC": str(home / "netrc"),
              "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1", "WANDB_SILENT": "true", "WANDB_MODE": "offline"}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("VIT_RUNS", raising=False)
    if key:
        monkeypatch.setenv("WANDB_API_KEY", key)
    monkeypatch.chdir(home)
    return {**os.environ}


def log_offline(runs: dict[Path, float], env: dict) -> None:
    """One offline W&B run in each run folder, as a training writes it (<run>/wandb/offline-run-*), logging
    ``train/loss`` = the value given, then 0."""
    code = textwrap.dedent(f"""
        import wandb
        for folder, loss in {[(str(f), v) for f, v in runs.items()]!r}:
            run = wandb.init(project="vit", dir=folder, mode="offline")
            run.log({{"train/loss": loss}}); run.log({{"train/loss": 0.0}})
            run.finish()
        """)
    for folder in runs:
        folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)


def offline(run: Path) -> Path:
    (folder,) = (run / "wandb").glob("offline-run-*")
    return folder


def run_id(run: Path) -> str:
    return offline(run).name.rsplit("-", 1)[1]


def uploaded(server) -> dict[str, list[float]]:
    """What the server was sent: each W&B run's ``train/loss`` rows."""
    return {run: [row["train/loss"] for row in rows] for run, rows in server.runs.items()}


def test_uploads_what_is_not_uploaded_and_only_that(tmp_path, monkeypatch, wandb_server):
    """vit-sync in this process (`wandb sync` is its subprocess); two runs of three first, then the rest."""
    env = environment(monkeypatch, wandb_server, tmp_path)
    a, b, c = (tmp_path / "runs" / name / "version_0" for name in ("small", "fast", "late"))
    log_offline({a: 2.5, b: 1.5, c: 0.5}, env)

    dry = sync_here("--dry-run", "runs/small", "runs/fast")
    assert dry.returncode == 0 and wandb_server.runs == {}, dry.stderr
    listed = sorted(f"  {offline(r).relative_to(tmp_path)}" for r in (a, b))
    said = dry.stdout.splitlines()
    assert said[0] == "would upload 2 offline W&B runs of 2 under runs/small, runs/fast:" and sorted(said[1:]) == listed

    first = sync_here("runs/small", "runs/fast")
    assert first.returncode == 0, first.stdout + first.stderr
    assert uploaded(wandb_server) == {run_id(a): [2.5, 0.0], run_id(b): [1.5, 0.0]}
    assert all(log.with_name(log.name + ".synced").is_file() for r in (a, b) for log in offline(r).glob("*.wandb"))
    said = first.stdout.splitlines()
    assert said[0] == "uploading 2 offline W&B runs of 2 under runs/small, runs/fast:" and said[3] == "uploaded 2 runs"
    assert sorted(said[1:3]) == sorted(said[4:]) == listed

    wandb_server.runs.clear()
    second = sync_here()  # (default: runs)
    assert second.returncode == 0, second.stdout + second.stderr
    assert uploaded(wandb_server) == {run_id(c): [0.5, 0.0]}
    assert second.stdout.splitlines()[:2] == ["uploading 1 offline W&B run of 3 under runs (2 uploaded before):",
                                              f"  {offline(c).relative_to(tmp_path)}"]

    wandb_server.runs.clear()
    third = sync_here("runs")
    assert (third.returncode, third.stdout, wandb_server.runs) == (
        0, "nothing to upload: 3 offline W&B runs under runs, all uploaded\n", {})


@pytest.mark.long
@pytest.mark.lowest  # (wandb's lower bound: pyproject.toml)
def test_a_refused_upload_fails_and_is_tried_again(tmp_path, monkeypatch, wandb_server):
    """A server that refuses (403 to every GraphQL call): no mark, exit 1 naming the run; the next call uploads it."""
    env = environment(monkeypatch, wandb_server, tmp_path)
    run = tmp_path / "runs/small/version_0"
    log_offline({run: 2.5}, env)
    wandb_server.refuse = True
    refused = sync_here()
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stderr == (f"error: `wandb sync` did not upload 1 run (its lines above say why; run this command "
                              f"again to retry): {offline(run).relative_to(tmp_path)}\n")
    wandb_server.refuse = False
    again = sync_here()
    assert again.returncode == 0 and uploaded(wandb_server) == {run_id(run): [2.5, 0.0]}, again.stderr


def test_no_credentials_or_no_folder_is_one_line_before_any_upload(tmp_path, monkeypatch, wandb_server):
    run = tmp_path / "runs/small/version_0/wandb/offline-run-20260101_000000-abcd1234"
    run.mkdir(parents=True)
    (run / "run-abcd1234.wandb").write_bytes(b"")  # (found by its name; never read: nothing is uploaded)
    environment(monkeypatch, wandb_server, tmp_path, key=None)
    no_key = sync_here()
    assert (no_key.returncode, no_key.stderr) == (2, f"error: no W&B credentials for http://127.0.0.1:"
                                                     f"{wandb_server.server_port}: run `wandb login` on this machine "
                                                     "(or set WANDB_API_KEY), then this command again\n")
    assert sync_here("--dry-run").stdout.startswith("would upload 1 offline W&B run of 1 under runs:")
    environment(monkeypatch, wandb_server, tmp_path)
    missing = sync_here("scratch/runs")
    assert (missing.returncode, missing.stderr) == (
        2, "error: scratch/runs: no such folder (give the folder that holds the runs, e.g. runs)\n")
    assert wandb_server.runs == {} and not list(run.glob("*.synced"))



def test_the_starts_of_one_run_are_one_w_and_b_run_with_each_step_once(tmp_path, monkeypatch, wandb_server):
    """A training started three times (resumed twice) logs three offline W&B runs with one id, each from W&B step
    0, and not asking wandb to resume (wandb.init's default): vit-sync uploads them as one W&B run that goes on
    after each start's last step, none replacing what an earlier one uploaded."""
    env = environment(monkeypatch, wandb_server, tmp_path)
    run = tmp_path / "runs/smoke/slurm-7"
    run.mkdir(parents=True)
    code = textwrap.dedent(f"""
        import time, wandb
        for start in range(3):
            time.sleep(1.1 if start else 0)  # (a folder's name holds the second of its start)
            run = wandb.init(project="vit", dir={str(run)!r}, mode="offline", id="abcd1234")
            for step in range(4 * start, 4 * start + 4):
                run.log({{"train/loss": 10.0 - step, "trainer/global_step": step}})
            run.finish()
        """)
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    synced = sync_here("runs")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert synced.stdout.startswith("uploading 3 offline W&B runs of 3 under runs:")
    assert wandb_server.faults == []
    (rows,) = wandb_server.runs.values()
    assert [row["trainer/global_step"] for row in rows] == list(range(12))
    assert [row["_step"] for row in rows] == list(range(12))  # W&B's steps go on too
    assert [row["train/loss"] for row in rows] == [10.0 - step for step in range(12)]


@pytest.mark.long
@pytest.mark.lowest  # (wandb's lower bound: pyproject.toml)
def test_a_run_preempted_twice_offline_is_one_w_and_b_run_with_each_step_once(tmp_path, monkeypatch, wandb_server,
                                                                            fake_cifar_session):
    """A SLURM job logging offline (no credentials on its node) gets SIGUSR1 at step 2 and, requeued, at step 4
    (exit 4 each time), and ends at step 6: three offline W&B runs with one id, the first uploaded by vit-sync
    while the job waited in the queue, the others by a later one. The W&B run has each step's metrics once, in
    order, none replaced by a later start's; its console goes on too."""
    environment(monkeypatch, wandb_server, tmp_path)
    for key, value in SLURM_TASK.items():
        monkeypatch.setenv(key, value)
    tiny = ["--model.arch.dim", "16", "--model.arch.depth", "1", "--model.arch.heads", "2", "--data.batch_size", "64",
            "--trainer.log_every_n_steps", "1", "--trainer.max_epochs", "1", "--test_after_fit", "false"]
    stop = ["--trainer.callbacks+=callbacks.SignalAtBatch", "--trainer.callbacks.signal", "SIGUSR1",
            "--trainer.callbacks.batch"]
    for extra, code in (([*stop, "2"], 4), ([*stop, "4", "--ckpt_path", "last"], 4), (["--ckpt_path", "last"], 0)):
        proc = train(tmp_path, fake_cifar_session, *tiny, *extra)
        assert proc.returncode == code, proc.stderr[-3000:]
        if code == 4 and not wandb_server.runs:
            first = sync_here("runs")
            assert first.returncode == 0 and "uploading 1 offline W&B run of 1" in first.stdout, first.stderr
    run = tmp_path / "runs/smoke/slurm-77"
    assert len(list((run / "wandb").glob("offline-run-*"))) == 3
    synced = sync_here("runs")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert "uploading 2 offline W&B runs of 3 under runs (1 uploaded before):" in synced.stdout
    assert wandb_server.faults == []
    (rows,) = wandb_server.runs.values()
    steps = [row["_step"] for row in rows]
    assert steps == list(range(len(rows))), steps  # W&B's steps go on from each start's last
    with open(run / "metrics.csv", newline="") as f:  # what the three starts logged, each step once (CSVLogger)
        logged = [(int(row["step"]), float(row["train/loss_step"])) for row in csv.DictReader(f) if row["train/loss_step"]]
    uploaded = [(row["trainer/global_step"], row["train/loss_step"]) for row in rows if "train/loss_step" in row]
    assert [step for step, _ in uploaded] == [step for step, _ in logged] == sorted({step for step, _ in logged})
    assert [loss for _, loss in uploaded] == pytest.approx([loss for _, loss in logged], rel=1e-6)
    assert len(logged) >= 3 and logged[-1][0] == 5
    assert [row["trainer/global_step"] for row in rows if "val/acc" in row] == [5]
    (console,) = [files["output.log"] for files in wandb_server.lines.values()]
    printed = [line for folder in sorted((run / "wandb").glob("offline-run-*"))
               for line in (folder / "files" / "output.log").read_text().splitlines()]
    assert len(console) == len(printed) and all(line.endswith(mine) for line, mine in zip(console, printed)), console
