"""vit-sync: the W&B runs logged offline under a folder are uploaded with `wandb sync`, each once — against a
stand-in W&B server on 127.0.0.1 that answers what `wandb sync` asks (GraphQL, file uploads, the file stream)
and keeps what it was sent."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import fake_wandb, sync_here

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
