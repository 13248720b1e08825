"""What the tests share: small datasets written in CIFAR-10's official format and as class folders, the
smoke recipe run as a user runs it (a subprocess) or through vit-train's main() in this process, and the
checks of a run's outputs, a stand-in W&B server. Test modules import from here, never from each other."""

import contextlib
import hashlib
import http.server
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
# 6 ms: a step checkpoint after every step (the processes decide it at the check steps: every log_every_n_steps)
EVERY_STEP = ["--step_checkpoint_minutes", "0.0001", "--trainer.log_every_n_steps", "1"]
# a one-task SLURM job's variables: set in this process, vit-train runs as that job (run folder slurm-77)
SLURM_TASK = {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS_PER_NODE": "1",
              "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_NAME": "vit",
              "SLURM_NODELIST": "localhost", "SLURM_CPUS_ON_NODE": "2"}
TEST_LINE = r"test on (\d+) images(?: \(of \d+: [^)]+\))? with (.*): top-1 ([\d.]+)%, top-5 ([\d.]+)%"


def make_fake_cifar(root: Path, per_batch: int = 100, test_size: int = 200, seed: int = 0) -> Path:
    """cifar-10-batches-py/ under root, in the official format (vit.data.cifar.write_fake: a learnable task)."""
    from vit.data.cifar import write_fake

    return write_fake(root, per_batch, test_size, seed)


def train(cwd: Path, data: Path | None, *extra: str, timeout: int = 300, quiet: bool = True) -> subprocess.CompletedProcess:
    """scripts/train.py with the smoke recipe; ``quiet``: progress bar and model summary off."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]),  # (this tree's vit, whatever
           "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}  # the environment has installed)
    env.pop("WANDB_API_KEY", None)
    env.pop("WANDB_MODE", None)
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), *smoke_argv(data, extra, quiet)]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def smoke_argv(data: Path | None, extra: tuple[str, ...], quiet: bool) -> list[str]:
    """vit-train's arguments for the smoke recipe on the generated data (``extra`` may start with ``test``)."""
    data_args = ["--data.root", str(data), "--data.val_size", "100", "--data.num_workers", "0",
                 "--data.batch_size", "50"] if data else []
    mode, extra = (["test"], extra[1:]) if extra[:1] == ("test",) else ([], extra)
    return [*mode, "--config", "smoke", *data_args, *(QUIET if quiet else []), *extra]


def train_here(cwd: Path, data: Path | None, *extra: str, quiet: bool = True, wandb: str = "disabled") -> int:
    """vit-train's main() in this process, with ``train``'s arguments (W&B off, or in ``wandb``'s WANDB_MODE): its
    exit status. Its output is the test's ``capsys`` (error lines) and ``caplog`` (the rest)."""
    from vit.commands.train import main

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", wandb)
        patch.chdir(cwd)
        return main(smoke_argv(data, extra, quiet))


def errors_of(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def best_val_acc(ckpt: dict) -> float:
    """val/acc as computed by the run itself, from its best-checkpoint callback's state."""
    (score,) = [cb["best_model_score"].item() for cb in ckpt["callbacks"].values() if cb.get("monitor") == "val/acc"]
    return score


def wandb_records(path: Path) -> list[bytes]:
    """The records of a W&B run file (``run-*.wandb``), each whole: the file is a LevelDB log, 32 KiB blocks of
    fragments, each behind a 7-byte header (crc, length, type), so a key can straddle a block's end in the raw
    bytes. After the file's own 7-byte header."""
    import struct
    import zlib

    data, block, records, pos, partial = path.read_bytes(), 32768, [], 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        fragment, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0 and length == 0:  # (a block's zero padding)
            continue
        assert kind in (1, 2, 3, 4) and zlib.crc32(bytes([kind]) + fragment) == crc, f"{path}: not read in step at {pos}"
        if kind in (1, 2):  # FULL, FIRST
            partial = fragment
        elif kind in (3, 4):  # MIDDLE, LAST
            partial += fragment
        if kind in (1, 4):
            records.append(partial)
    return records


def wandb_summary_keys(path: Path) -> set[str]:
    """The top-level keys that the run's summary records (run.summary.update, and wandb's own) set."""
    from wandb.proto import wandb_internal_pb2 as pb

    keys = set()
    for data in wandb_records(path):
        record = pb.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "summary":
            keys |= {item.key or item.nested_key[0] for item in record.summary.update}
    return keys


def digest(folder: Path) -> dict:
    return {p.relative_to(folder): hashlib.md5(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()}


def write_images(folder, n, colour, size=40, seed=0):
    """n noisy images of one colour, PNG and JPEG, of varied sizes and modes."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        pixels = np.clip(np.array(colour)[None, None] + rng.normal(0, 25, (size + i, size + 2 * i, 3)), 0, 255)
        image = Image.fromarray(pixels.astype(np.uint8))
        (image if i % 3 else image.convert("L")).save(folder / (f"{i}.jpg" if i % 2 else f"{i}.png"))


def write_bad_files(folder):
    folder.mkdir(parents=True, exist_ok=True)
    jpeg = folder / "whole.jpg"
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(jpeg, quality=90)
    (folder / "truncated.jpg").write_bytes(jpeg.read_bytes()[: jpeg.stat().st_size // 2])
    jpeg.unlink()
    (folder / "empty.png").write_bytes(b"")
    (folder / "notes.png").write_text("not an image")


def run_here(script, *args):
    """The same command's main() in this process (its options, without a subprocess's start-up):
    an object with returncode, stdout and stderr, as ``run`` gives."""
    import contextlib
    import importlib
    import io

    main = importlib.import_module(f"vit.commands.{script.removesuffix('.py')}").main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return subprocess.CompletedProcess(script, code, out.getvalue(), err.getvalue())


def sync_here(*args, timeout: float = 300):
    """vit-sync's main() in this process (``run_here``), its `wandb sync` killed after ``timeout`` seconds: a
    wandb that never ends fails the test (subprocess.TimeoutExpired) instead of stalling the suite."""
    import functools

    with pytest.MonkeyPatch.context() as patch:  # (subprocess.run, as vit.reporting.sync calls it, for this call only)
        patch.setattr(subprocess, "run", functools.partial(subprocess.run, timeout=timeout))
        return run_here("sync.py", *args)


def assert_same_training_state(a: dict, b: dict) -> None:
    assert a["global_step"] == b["global_step"] and a["epoch"] == b["epoch"]
    for key, value in a["state_dict"].items():
        torch.testing.assert_close(b["state_dict"][key], value, rtol=0, atol=0, msg=key)
    (oa,), (ob,) = a["optimizer_states"], b["optimizer_states"]
    for key, value in oa["state"].items():
        for name, tensor in value.items():
            torch.testing.assert_close(ob["state"][key][name], tensor, rtol=0, atol=0, msg=f"optimizer {key} {name}")
    assert a["schedule"] == b["schedule"]


class FakeWandb(http.server.BaseHTTPRequestHandler):
    """Answers wandb-core's sync as W&B's server does: UpsertBucket (the run, with the history lines it holds),
    RunResumeStatus (a run that exists: its line counts, last history row and summary, so that a resumed run goes
    on after them), CreateRunFiles (where to PUT its files), the file stream. The file stream writes each file's
    lines where the request's ``offset`` puts them: lines already there are replaced (as a run logged twice from
    offset 0 replaces its history), lines past the end are appended; an offset past the end leaves a gap, which
    the server refuses (``server.faults``). ``server.runs`` maps each W&B run id to its history rows; with
    ``server.refuse`` set, every GraphQL call gets a permission error."""

    def log_message(self, *args):
        pass

    def reply(self, answer: dict, status: int = 200):
        body = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def bucket(self, name: str) -> dict:
        """The run as the server's GraphQL API shows it."""
        server, rows = self.server, self.server.runs.get(name, [])
        lines = server.lines.get(name, {})
        config = server.configs.get(name) or "{}"
        wandb_config = {"t": json.loads(config).get("_wandb", {}).get("value", {}).get("t", {})}
        return {"id": name, "name": name, "displayName": name, "description": None, "config": config,
                "sweepName": None, "historyLineCount": len(rows), "eventsLineCount": len(lines.get("wandb-events.jsonl", [])),
                "logLineCount": len(lines.get("output.log", [])), "summaryMetrics": json.dumps(server.summaries.get(name, {})),
                "historyTail": json.dumps([json.dumps(row) for row in rows[-10:]]),
                "eventsTail": json.dumps(lines.get("wandb-events.jsonl", [])[-10:]), "tags": [], "notes": None,
                "wandbConfig": json.dumps(wandb_config),
                "project": {"id": "p", "name": "vit", "entity": {"id": "e", "name": "team"}}}

    def write(self, name: str, file: str, offset: int, content: list[str]) -> None:
        """Lines ``content`` of ``file`` from line ``offset`` on."""
        server = self.server
        if file == "wandb-summary.json":  # the whole summary, each time
            server.summaries[name] = json.loads(content[-1]) if content else {}
            return
        lines = server.runs.setdefault(name, []) if file == "wandb-history.jsonl" else \
            server.lines.setdefault(name, {}).setdefault(file, [])
        if offset > len(lines):
            server.faults.append(f"{name}/{file}: lines {offset}.. posted where it holds {len(lines)}")
            return
        parse = json.loads if file == "wandb-history.jsonl" else str
        lines[offset:offset + len(content)] = [parse(line) for line in content]

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.startswith("/graphql"):
            request = json.loads(body)
            operation = re.search(r"(?:query|mutation)\s+(\w+)", request.get("query", ""))
            variables = request.get("variables") or {}
            if self.server.refuse:
                return self.reply({"errors": [{"message": "permission denied"}]}, 403)
            name = operation.group(1) if operation else None
            if name == "UpsertBucket":
                run = variables["name"]
                inserted = run not in self.server.configs
                if variables.get("config") or inserted:
                    self.server.configs[run] = variables.get("config") or "{}"
                self.server.runs.setdefault(run, [])
                return self.reply({"data": {"upsertBucket": {"inserted": inserted, "bucket": self.bucket(run)}}})
            if name == "RunResumeStatus":
                run = variables["name"]
                return self.reply({"data": {"model": {"id": "p", "name": "vit", "entity": {"id": "e", "name": "team"},
                                                      "bucket": self.bucket(run) if run in self.server.configs else None}}})
            url = f"http://127.0.0.1:{self.server.server_port}/upload/"
            if name == "CreateRunFiles":
                return self.reply({"data": {"createRunFiles": {"runID": variables["run"], "uploadHeaders": [], "files": [
                    {"name": f, "uploadUrl": url + f} for f in variables["files"]]}}})
            # the checkpoints and tables a run logs as artifacts: created, their files and manifest put, committed
            artifact = variables.get("artifactID") or "artifact"
            answers = {
                "ServerFeaturesQuery": {"serverInfo": {"features": []}},
                "CreateArtifact": {"createArtifact": {"artifact": {
                    "id": artifact, "state": "PENDING", "artifactSequence": {"latestArtifact": None}}}},
                "CreateArtifactFiles": {"createArtifactFiles": {"files": {"edges": [{"node": {
                    "storagePath": f["name"], "uploadUrl": url + f["name"], "uploadHeaders": [],
                    "uploadMultipartUrls": None, "artifact": {"id": artifact}}}
                    for f in (variables.get("input") or {}).get("artifactFiles", [])]}}},
                "CreateArtifactManifest": {"createArtifactManifest": {"artifactManifest": {
                    "id": "manifest", "file": {"id": "manifest", "uploadUrl": url + "manifest", "uploadHeaders": []}}}},
                "CommitArtifact": {"commitArtifact": {"artifact": {"id": artifact, "digest": "0"}}},
                "UseArtifact": {"useArtifact": {"artifact": {"id": artifact}}},
            }
            return self.reply({"data": answers.get(name, {})})
        stream = re.fullmatch(r"/files/[^/]+/[^/]+/([^/]+)/file_stream", self.path)
        if stream:
            with self.server.lock:
                for file, part in json.loads(body).get("files", {}).items():
                    self.write(stream.group(1), file, part.get("offset", 0), part.get("content", []))
        return self.reply({})

    def do_PUT(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


@contextlib.contextmanager
def fake_wandb():
    """A stand-in W&B server on 127.0.0.1 (FakeWandb) for `wandb sync`: ``server.runs`` maps each W&B run id it
    was sent to its history rows; point WANDB_BASE_URL at ``http://127.0.0.1:{server.server_port}``."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeWandb)
    server.runs, server.refuse = {}, False
    server.lines, server.summaries, server.configs, server.faults = {}, {}, {}, []
    server.lock = threading.Lock()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
