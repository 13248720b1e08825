"""Several processes without a scheduler: Lightning's DDP with the settings a user gets (progress bar on,
in a terminal; W&B on), a process that stops answering, and torchrun across two "nodes" on 127.0.0.1."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from launch import DATA_ARGS, ROOT, in_terminal, max_abs_diff, run_together, user_env
from helpers import EVERY_STEP, TEST_LINE, best_val_acc, load

TRAIN = [str(ROOT / "scripts" / "train.py"), "--config", "smoke", *DATA_ARGS]


def single_process_accuracy(ckpt: dict, data: Path, val_size: int) -> float:
    from vit.data.datamodules import CIFAR10DataModule
    from vit.training.module import ViTClassifier

    model = ViTClassifier(**{k: v for k, v in ckpt["hyper_parameters"].items() if not k.startswith("_")})
    model.load_state_dict(ckpt["state_dict"])
    dm = CIFAR10DataModule(root=str(data), val_size=val_size, num_workers=0, batch_size=50)
    dm.setup("fit")
    assert len(dm.val_set) == val_size
    model.eval()
    with torch.no_grad():
        correct = sum((model(x).argmax(-1) == y).sum().item() for x, y in dm.val_dataloader())
    return correct / val_size


def test_ddp_with_the_defaults_a_user_gets(tmp_path, fake_cifar_session):
    """2 processes (gloo), base.yaml's callbacks and loggers, tqdm's bar on a terminal, W&B offline. Each of
    the 101 validation images counts once (2 ranks: 51 + 50, no padding), as one process counts them.
    With the GPU recipes' options: Muon, and a resize stage whose switch every rank takes at the same
    step (a time budget too, so the ranks share rank 0's clock every step)."""
    cmd = [sys.executable, *TRAIN, "--data.root", str(fake_cifar_session), "--trainer.devices", "2",
           "--trainer.strategy", "ddp", "--trainer.accelerator", "cpu", "--trainer.max_epochs", "2",
           "--trainer.max_time", "00:00:05:00", "--model.optimizer.name", "muon", "--model.schedule.resize_stages", "[[16, 0.5]]"]
    code, out, seconds = in_terminal(cmd, tmp_path, user_env(), timeout=300)
    print(f"DDP with the defaults: {seconds:.1f} s")
    assert code is not None, f"hung: killed after {seconds:.0f} s\n{out[-3000:]}"
    assert code == 0, out[-3000:]
    assert "Epoch 1: 100%" in out and "Validation DataLoader 0: 100%" in out  # tqdm's bars were on
    run = tmp_path / "runs" / "smoke" / "version_0"
    assert [p.name for p in run.parent.iterdir()] == ["version_0"]  # both processes wrote into one folder
    (best,) = (run / "checkpoints").glob("best-*.ckpt")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == sorted([best.name, "last.ckpt"])
    assert len(list((run / "wandb").glob("offline-run-*"))) == 1
    assert len(re.findall(TEST_LINE, out)) == 1
    assert "sync_dist=True" not in out and "Traceback" not in out
    assert out.count("training on 16-px images") == 1 and out.count("training on 32-px images") == 1  # rank 0 says it
    ckpt = load(best)
    ddp = best_val_acc(ckpt)
    assert round(ddp * 101, 4) == round(ddp * 101)  # a count of the 101 images, not of 102 with a repeat
    assert single_process_accuracy(ckpt, fake_cifar_session, 101) == pytest.approx(ddp, abs=1e-6)


def test_a_stuck_process_ends_the_run_with_a_message_not_a_hang(tmp_path, fake_cifar_session):
    """Rank 1 stops answering after epoch 0 (it sleeps 60 s in a callback) while rank 0 waits for it in a
    collective. With --ddp_timeout 15, rank 1 says within it where it is stuck (the callback's sleep: each
    thread's stack), and rank 0 that it waited for another process (its own watchdog's line, or the lost
    contact once rank 1 is gone); both exit 5, long before rank 1 would wake."""
    cmd = [sys.executable, *TRAIN, "--data.root", str(fake_cifar_session), *DDP, "--trainer.max_epochs", "3",
           "--ddp_timeout", "15", "--trainer.callbacks+=callbacks.StallRank", "--trainer.callbacks.seconds", "60"]
    code, out, ended = run_rank_zero(cmd, tmp_path, timeout=200, until="error: process 1:")
    stalled = float((tmp_path / "runs" / "smoke" / "version_0" / "stalled.1").read_text())
    print(f"rank 0 ended {ended - stalled:.1f} s after rank 1 stalled, with exit {code}")
    assert code == 5, out[-3000:]
    assert "error: process 1: no batch started or finished in 15 s: it is stuck" in out, out[-3000:]
    # rank 1 says where: StallRank's sleep (rank 0's stack, when its own watchdog speaks too, is in another
    # callback's on_train_epoch_end, waiting in a collective)
    assert re.search(r'tests/callbacks\.py", line \d+ in on_train_epoch_end', out), out[-3000:]
    assert "error: process 0: no batch started or finished in 15 s" in out or \
        "error: process 0: lost the other processes of this run" in out, out[-3000:]
    assert ended - stalled < 50  # rank 0 ended long before rank 1's sleep would


def run_rank_zero(cmd: list[str], cwd: Path, timeout: float, until: str | None = None) -> tuple[int, str, float]:
    """Lightning's DDP from one command (rank 0 starts rank 1): rank 0's exit status, the output of both
    (once ``until`` is in it too, or 30 s after rank 0 ended), and when rank 0 ended (time.time())."""
    log = cwd / "out.txt"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=cwd, env=user_env(), stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"rank 0 still running after {timeout} s:\n{log.read_text()[-3000:]}")
        ended = time.time()
        deadline = time.monotonic() + 30
        while until and until not in log.read_text() and time.monotonic() < deadline:
            time.sleep(1)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # rank 1, if it is still there
        except ProcessLookupError:
            pass
    return code, log.read_text(), ended


DDP = ["--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.accelerator", "cpu", "--trainer.logger", "false",
       "--trainer.enable_progress_bar", "false"]


def test_a_collective_stuck_in_validation_ends_the_run_with_exit_5(tmp_path, fake_cifar_session):
    """Rank 1 stops answering after its second validation batch (it sleeps 40 s) while rank 0 finishes its
    validation and waits for it in the validation's collectives. The watchdog spares slow work, not this:
    with --ddp_timeout 15, rank 1 says where it is stuck and both exit 5, long before rank 1 would wake."""
    cmd = [sys.executable, *TRAIN, "--data.root", str(fake_cifar_session), *DDP, "--trainer.max_epochs", "2",
           "--ddp_timeout", "15", "--trainer.callbacks+=callbacks.StallRank", "--trainer.callbacks.seconds", "40",
           "--trainer.callbacks.in_validation", "true"]
    code, out, ended = run_rank_zero(cmd, tmp_path, timeout=200, until="error: process 1:")
    stalled = float((tmp_path / "runs" / "smoke" / "version_0" / "stalled.1").read_text())
    print(f"rank 0 ended {ended - stalled:.1f} s after rank 1 stalled, with exit {code}")
    assert code == 5, out[-3000:]
    assert "error: process 1: no batch started or finished in 15 s: it is stuck" in out, out[-3000:]
    assert re.search(r'tests/callbacks\.py", line \d+ in stall', out), out[-3000:]
    assert "error: process 0: no batch started or finished in 15 s" in out or \
        "error: process 0: lost the other processes of this run" in out, out[-3000:]
    assert ended - stalled < 35  # long before rank 1 would wake


def test_a_bug_whose_words_say_timed_out_is_exit_1_with_its_traceback_under_ddp(tmp_path, fake_cifar_session):
    """A user's callback raises RuntimeError("timed out") on both processes under DDP: a bug, whatever its
    words (only torch.distributed's errors and gloo's own become exit 5): exit 1 with the traceback, no
    error line."""
    cmd = [sys.executable, *TRAIN, "--data.root", str(fake_cifar_session), *DDP, "--trainer.max_epochs", "1",
           "--ddp_timeout", "120", "--trainer.callbacks+=callbacks.RaiseMidTraining",
           "--trainer.callbacks.error", "RuntimeError", "--trainer.callbacks.message", "timed out"]
    code, out, _ = run_rank_zero(cmd, tmp_path, timeout=200)
    assert code == 1, out[-3000:]
    assert "Traceback (most recent call last)" in out and "RuntimeError: timed out" in out, out[-3000:]
    assert re.search(r"callbacks\.py\", line \d+, in on_train_batch_end", out)
    assert not [line for line in out.splitlines() if line.startswith("error:")], out[-3000:]


@pytest.mark.parametrize("error, failing, status, reason", [
    ("oom", 1, 7, "the accelerator ran out of memory"),
    ("oom", 0, 7, "the accelerator ran out of memory"),
    ("dataset", 1, 2, "data/cifar-10-batches-py/data_batch_3 is truncated: re-download CIFAR-10"),
    ("bug", 1, 1, "a bug, whose traceback that process prints: KeyError: 'label'"),
])
def test_a_process_that_fails_for_a_known_cause_ends_the_others_with_its_line(tmp_path, fake_cifar_session, error,
                                                                              failing, status, reason):
    """One process fails at step 2 — out of device memory (torch's error, raised on CPU), a bad input only it
    read, or a bug (its traceback) — while the other goes on into step 3's gradient all-reduce and waits there. With --ddp_timeout 300,
    the other ends seconds after that error, not 300 s: with the same exit status and a line that names the
    failed process and its reason. Rank 1 failing, and rank 0, whose process hosts the process group's store."""
    other = 1 - failing
    cmd = [sys.executable, *TRAIN, "--data.root", str(fake_cifar_session), *DDP, "--trainer.max_epochs", "2",
           "--ddp_timeout", "300", "--trainer.callbacks+=callbacks.RaiseAtStep", "--trainer.callbacks.error", error,
           "--trainer.callbacks.rank", str(failing)]
    told = f"error: process {other}: process {failing} failed, and this one stopped with it instead of waiting " \
           f"for it: {reason}"
    code, out, ended = run_rank_zero(cmd, tmp_path, timeout=400, until=told if other else f"error: {reason}")
    raised = float((tmp_path / "runs" / "smoke" / "version_0" / f"raised.{failing}").read_text())
    print(f"rank 0 ended {ended - raised:.1f} s after rank {failing}'s error")
    assert code == status, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert any(line.startswith(told) for line in errors), out[-3000:]  # (rank 1's: within 30 s of rank 0's end)
    # the failed process's own line too, once: it failed first (a bad input too, though others may meet it alike)
    assert ended - raised < 90  # (about 15 s: a poll, a grace and the acknowledgements), not the 300 s
    if status == 1:  # a bug: its traceback, from the process that raised it, and no line of its own
        assert "Traceback (most recent call last)" in out and "KeyError: 'label'" in out, out[-3000:]
        return
    own = [line for line in errors if line.startswith(f"error: {reason}")]
    assert len(own) == 1, out[-3000:]
    assert "Traceback" not in out


GLOO_PAIR = """
import datetime, os, sys, time
import torch, torch.distributed as dist
from vit.failures import lost_contact
rank, how = int(sys.argv[1]), sys.argv[2]
open(f"imported.{rank}", "w").close()  # both imported torch (however slowly) before the 5 s of the group start
deadline = time.monotonic() + 120
while not os.path.exists(f"imported.{1 - rank}"):
    if time.monotonic() > deadline:
        sys.exit(f"process {1 - rank} did not start within 120 s")
    time.sleep(0.05)
dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=5))
dist.all_reduce(torch.ones(1))
if rank == 1:
    time.sleep(1 if how == "dies" else 20)
    os._exit(0)
try:
    dist.all_reduce(torch.ones(1))
except RuntimeError as e:
    print(f"{how}: {lost_contact(e)}: {e}", flush=True)
os._exit(0)
"""


def test_gloos_own_errors_are_lost_contact_and_a_bugs_words_are_not(tmp_path):
    """The errors gloo itself raises in torch 2.14 (plain RuntimeErrors) when a peer dies mid-collective and when
    a collective times out are lost contact (exit 5); torch.distributed's error types are; a RuntimeError of
    anyone else's is not, whatever its words."""
    import torch.distributed as dist

    from vit.failures import lost_contact

    for how in ("dies", "times out"):
        for ready in tmp_path.glob("imported.*"):
            ready.unlink()
        env = user_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        ranks = [subprocess.Popen([sys.executable, "-c", GLOO_PAIR, str(rank), how], env=env, cwd=tmp_path,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for rank in (0, 1)]
        try:
            out = ranks[0].communicate(timeout=180)[0]
        finally:
            for process in ranks:
                process.kill()
                process.wait()
        assert out.startswith(f"{how}: True: ["), out
        print(out.strip())
    for error in (dist.DistBackendError, dist.DistNetworkError, dist.DistStoreError):
        assert lost_contact(error("x"))
    for words in ("timed out", "Connection reset by peer", "connection closed by peer", "Broken pipe",
                  "[x] Timed out waiting 5000ms for recv operation to complete"):
        assert not lost_contact(RuntimeError(words))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_across_two_nodes_gives_one_run(tmp_path, fake_cifar_session):
    """README's torchrun line, two "nodes" of one process on 127.0.0.1: one run folder, one W&B run,
    checkpoints written once, the test line once; nodes and devices from torchrun. With W&B credentials and
    a W&B server that never answers: rank zero alone asks, once, and the run logs offline."""
    torchrun = Path(sys.executable).with_name("torchrun")
    port = free_port()
    with socket.socket() as silent:  # W&B credentials, and a W&B server that never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        env = user_env(WANDB_API_KEY="0123456789abcdef0123456789abcdef01234567",
                       WANDB_BASE_URL=f"http://127.0.0.1:{silent.getsockname()[1]}")
        codes, out = run_together([[str(torchrun), "--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "1",
                                    "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
                                    "pair", *TRAIN, "--data.root", str(fake_cifar_session), "--trainer.max_epochs", "2",
                                    "--trainer.accelerator", "cpu"] for rank in (0, 1)], tmp_path, env, timeout=300)
    assert codes == [0, 0], out[-6000:]
    run = tmp_path / "runs" / "smoke" / "torchrun-pair"
    assert [p.name for p in run.parent.iterdir()] == ["torchrun-pair"]
    assert "torchrun pair: 1 process(es) per node on 2 node(s) (the allocation's; the recipe's num_nodes 1 " \
           "overridden)" in out
    (best,) = (run / "checkpoints").glob("best-*.ckpt")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == sorted([best.name, "last.ckpt"])
    assert len(list((run / "wandb").glob("offline-run-*"))) == 1
    assert out.count(f"wandb: {env['WANDB_BASE_URL']} did not answer within 10 s; logging offline") == 1  # rank 0
    assert len(re.findall(TEST_LINE, out)) == 1


def test_a_resume_whose_weights_do_not_fit_is_refused_on_every_node_before_training(tmp_path, fake_cifar_session,
                                                                                   trained_checkpoint):
    """Process 0 alone reads a resume's weights (the others get its decision, not the weights): weights that do
    not fit the model's options (edited, crafted) are refused in one line, and every process of both "nodes"
    ends with exit 2 before training, leaving no folder."""
    ckpt = load(trained_checkpoint)
    ckpt["state_dict"]["model.patch_embedding.proj.weight"] = torch.zeros(3, 3)
    torch.save(ckpt, tmp_path / "crafted.ckpt")
    torchrun, port = Path(sys.executable).with_name("torchrun"), free_port()
    codes, out = run_together([[str(torchrun), "--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "1",
                                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
                                "crafted", *TRAIN, "--data.root", str(fake_cifar_session), "--trainer.accelerator",
                                "cpu", "--trainer.logger", "false", "--data.val_size", "100",  # (the checkpoint's)
                                "--ckpt_path", str(tmp_path / "crafted.ckpt")]
                               for rank in (0, 1)], tmp_path, user_env(), timeout=300)
    assert codes == [1, 1] and re.findall(r"^\s*exitcode\s*: (\d+)", out, re.M) == ["2", "2"], out[-4000:]  # (torchrun's 1)
    (error,) = [line for line in out.splitlines() if line.startswith("error:")]
    assert error.startswith(f"error: {tmp_path / 'crafted.ckpt'}: its weights and its model's options do not fit "
                            f"together (Error(s) in loading state_dict for ViTClassifier: size mismatch"), out[-4000:]
    assert "Epoch 0" not in out and not (tmp_path / "runs").exists()


def test_a_process_that_fails_after_the_decision_ends_process_0_at_once(tmp_path, fake_cifar_session,
                                                                       trained_checkpoint):
    """Two processes of a launcher that kills none (RANK, WORLD_SIZE, MASTER_ADDR/PORT, as srun without
    --kill-on-bad-exit leaves them): process 1 fails on its own once process 0 has decided the run (its data,
    node-local, is missing), and process 0, which then checks the resume's weights and tells the others,
    ends at once (exit 5), not when its broadcast's time limit runs out. Process 1 says why, once: its data
    is its own, and process 0's line points to it."""
    port = str(free_port())
    data = [["--data.root", str(fake_cifar_session)],
            ["--data", "vit.data.ImageFolderDataModule", "--data.root", str(tmp_path / "missing")]]
    codes, out = run_together([["env", f"RANK={rank}", "LOCAL_RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                                f"MASTER_PORT={port}", sys.executable, *TRAIN, *data[rank], "--trainer.accelerator",
                                "cpu", "--trainer.logger", "false", "--data.val_size", "100",
                                "--ckpt_path", str(trained_checkpoint)] for rank in (0, 1)],
                              tmp_path, user_env(), timeout=120)
    assert codes == [5, 2], out[-4000:]
    assert "process 0: lost the other processes of this run" in out, out[-4000:]
    missing = [line for line in out.splitlines() if line.startswith("error: ") and "missing" in line]
    assert len(missing) == 1, out[-4000:]


def test_torchrun_restarts_a_killed_worker_and_the_group_ends_exact(tmp_path, fake_cifar_session):
    """`torchrun --max-restarts 1`, 2 processes on 127.0.0.1, a step checkpoint after every step: rank 1
    is killed with SIGKILL at step 5 of 7 in epoch 0. torchrun restarts the group; the new workers resume
    from the run folder's step checkpoint (step 4): same folder, same W&B run, and the uninterrupted
    group's weights."""
    torchrun = Path(sys.executable).with_name("torchrun")

    def group(name: str, *extra: str) -> tuple[int | None, str]:
        (code,), out = run_together([[str(torchrun), "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "1",
                                      "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                                      "--rdzv-id", name, *TRAIN, "--data.root", str(fake_cifar_session),
                                      "--data.batch_size", "50", "--trainer.max_epochs", "2", "--trainer.accelerator",
                                      "cpu", "--ckpt_path", "last", *EVERY_STEP, *extra]],
                                    tmp_path, user_env(), timeout=400)
        return code, out

    code, out = group("whole")
    assert code == 0, out[-4000:]
    code, out = group("killed", "--trainer.callbacks+=callbacks.CrashAtStep", "--trainer.callbacks.step", "5",
                      "--trainer.callbacks.rank", "1")
    assert code == 0, out[-4000:]
    assert re.search(r"exitcode\s*:\s*-9", out) and "resuming runs/smoke/torchrun-killed from its step.ckpt" in out, \
        out[-4000:]
    runs = tmp_path / "runs" / "smoke"
    assert sorted(p.name for p in runs.iterdir()) == ["torchrun-killed", "torchrun-whole"]
    ours, theirs = (load(runs / name / "checkpoints" / "last.ckpt") for name in ("torchrun-killed", "torchrun-whole"))
    assert ours["global_step"] == theirs["global_step"] == 14
    for key, value in theirs["state_dict"].items():
        torch.testing.assert_close(ours["state_dict"][key], value, rtol=0, atol=0, msg=key)
    wandb_runs = sorted((runs / "torchrun-killed" / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == 2 and len({r.name.rsplit("-", 1)[1] for r in wandb_runs}) == 1  # one W&B run
    assert len(re.findall(TEST_LINE, out)) == 1


def steps_seen(run: Path) -> dict[int, list[str]]:
    """step → the images all processes of the run trained on in that step (vit's RecordBatches lines)."""
    seen: dict[int, list[str]] = {}
    for path in run.glob("batches.*"):
        for line in path.read_text().splitlines():
            step, *images = line.split()
            seen.setdefault(int(step), []).extend(images)
    return {step: sorted(images) for step, images in seen.items()}


def test_more_processes_train_the_same_run(tmp_path, fake_cifar_session):
    """The smoke recipe (no batch-level mixing) with one global batch of 50 and the same seed, on 1 process,
    on Lightning's DDP × 2, and on torchrun across 2 "nodes" × 1: in every step the processes together
    train on the same 50 images, augmented alike, and the runs end with the same weights up to the order of
    float sums (DDP averages two half-batch gradients; one process takes the mean of the whole batch). So
    does a one-process run killed mid-epoch and resumed on DDP × 2 (a requeue onto another allocation)."""
    common = [*TRAIN, "--data.root", str(fake_cifar_session), "--trainer.max_epochs", "2",
              "--trainer.accelerator", "cpu", "--trainer.logger", "false", "--test_after_fit", "false",
              "--data.num_workers", "2", "--trainer.callbacks+=callbacks.RecordBatches",
              "--ddp_timeout", "120"]  # a collective that hangs ends the run with its message within the test's time
    torchrun, port = Path(sys.executable).with_name("torchrun"), free_port()
    launches = {
        "version_0": [[sys.executable, *common, "--run", "version_0"]],
        "ddp": [[sys.executable, *common, "--run", "ddp", "--trainer.devices", "2", "--trainer.strategy", "ddp"]],
        "torchrun-nodes": [[str(torchrun), "--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "1",
                            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "nodes",
                            *common] for rank in (0, 1)],
    }
    outs = {}
    for name, cmds in launches.items():
        codes, outs[name] = run_together(cmds, tmp_path, user_env(), timeout=300)
        assert codes == [0] * len(cmds), outs[name][-6000:]
    assert "global batch 50 = 2 processes × 25: lr" in outs["ddp"] and "global batch 50: lr" in outs["version_0"]
    runs = tmp_path / "runs" / "smoke"
    # a requeue onto another allocation: one process killed at step 5 of 14 (its step checkpoint: step 4),
    # resumed on DDP × 2 from the same global position
    (code,), out = run_together([[sys.executable, *common, "--run", "moved", *EVERY_STEP,
                                  "--trainer.callbacks+=callbacks.CrashAtStep", "--trainer.callbacks.step", "5"]],
                                tmp_path, user_env(), timeout=300)
    assert code == -9, out[-3000:]
    (runs / "moved" / "batches.0").unlink()  # the killed attempt's record: the resumed one is compared
    (code,), out = run_together([[sys.executable, *common, "--run", "moved", "--ckpt_path", "last", "--trainer.devices",
                                  "2", "--trainer.strategy", "ddp"]], tmp_path, user_env(), timeout=300)
    assert code == 0, out[-6000:]
    assert "resuming runs/smoke/moved from its step.ckpt" in out
    assert "resumed on 2 process(es) from a checkpoint of 1: the data continues at the same image" in out
    one = steps_seen(runs / "version_0")
    assert steps_seen(runs / "moved") == {step: images for step, images in one.items() if step >= 4}
    assert sorted(one) == list(range(14)) and all(len(images) == 50 for images in one.values())
    weights = load(runs / "version_0" / "checkpoints" / "last.ckpt")
    for name in ("ddp", "torchrun-nodes", "moved"):
        if name != "moved":  # (its steps from 4 on are compared above)
            assert steps_seen(runs / name) == one, name  # the same images, augmented alike, in every step
        ckpt = load(runs / name / "checkpoints" / "last.ckpt")
        assert ckpt["global_step"] == weights["global_step"] == 14
        delta = max_abs_diff(ckpt["state_dict"], weights["state_dict"])
        print(f"{name}: max |Δw| against one process after 14 steps: {delta:.3g}")
        assert delta < 1e-4, name


def test_a_step_issues_no_collective_but_the_gradients_all_reduce(tmp_path, fake_cifar_session):
    """2 processes (gloo), the step checkpoint on (its default), --trainer.max_time set: every decision that the
    processes must take alike (the step checkpoint's time, the time budget, the schedule's clock, divergence,
    SLURM's signal) is taken every log_every_n_steps steps, in one all-reduce. torch.profiler counts each
    step's collectives (tests/callbacks.py StepEvents, steps 3 to 14, none an epoch's last): the gradients'
    all-reduce alone in every other step, and that one more at the steps that are multiples of 4."""
    every = 4
    cmd = [sys.executable, *TRAIN, "--data.root", str(fake_cifar_session), *DDP, "--trainer.max_epochs", "1",
           "--data.batch_size", "16", "--trainer.log_every_n_steps", str(every), "--trainer.max_time", "00:00:30:00",
           "--test_after_fit", "false", "--trainer.callbacks+=callbacks.StepEvents", "--trainer.callbacks.start", "2",
           "--trainer.callbacks.steps", "12"]
    code, out, _ = run_rank_zero(cmd, tmp_path, timeout=300)
    assert code == 0, out[-3000:]
    run = tmp_path / "runs" / "smoke" / "version_0"
    import json

    for rank in (0, 1):
        steps = {int(s): v for s, v in json.loads((run / f"steps.{rank}.json").read_text()).items()}
        print(f"rank {rank}: " + "; ".join(f"step {s}: {dict(v['collectives'])}" for s, v in steps.items()))
        assert sorted(steps) == list(range(3, 15)), steps
        gradients = {"c10d::allreduce_": 1}
        for step, seen in steps.items():
            expected = {"c10d::allreduce_": 2} if step % every == 0 else gradients
            assert seen["collectives"] == expected, (rank, step, steps)
