"""What the machine does to a run that is not a bug, each turned into one line and its exit status
(vit.exits): a full disk or an exceeded quota, the accelerator's memory running out, GPUs allocated that
torch cannot use, NCCL's collective timeouts, and a W&B server out of reach (which is no failure: the
run logs offline)."""

from __future__ import annotations

import errno
import os
import shlex
import subprocess
import threading
from pathlib import Path

from vit import launch
from vit.exits import AcceleratorUnusable

STORAGE_FULL = (errno.ENOSPC, errno.EDQUOT)


def storage_full(error: OSError) -> bool:
    return error.errno in STORAGE_FULL


def resume_command(argv: list[str], run: Path) -> str:
    """The command that continues ``run``: this command line with --ckpt_path last --run <run>; in a SLURM job,
    the sbatch line (train.sbatch says --ckpt_path last itself; --run names this job's folder, which a new
    job would not resume otherwise)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--ckpt_path", "--run"):
            skip = True
        elif not arg.startswith(("--ckpt_path=", "--run=")):
            kept.append(arg)
    if launch.slurm_job():
        return shlex.join(["sbatch", "scripts/slurm/train.sbatch", *kept, "--run", run.name])
    return shlex.join(["python", "scripts/train.py", *kept, "--ckpt_path", "last", "--run", run.name])


def storage_message(error: OSError, run: Path | None, argv: list[str]) -> str:
    """One line: which path, why, the run's last good checkpoint and the command that resumes."""
    from vit import runs
    from vit.exits import RunError

    where = f" writing {error.filename}" if error.filename else ""
    cause = "no space left on the device" if error.errno == errno.ENOSPC else "the disk quota is exceeded"
    line = f"{cause}{where} ({errno.errorcode[error.errno]}: a full disk or an exceeded quota, not a bug)."
    if run is None:
        return line
    try:
        found = runs.newest_readable(run)
    except RunError:
        found = None
    last = f"its last good checkpoint is {found[0]} (step {found[1].get('global_step')})" if found else \
        "it has no checkpoint yet"
    return (f"{line} The run folder {run} is intact (checkpoints are written whole or not at all); {last}. Free "
            f"space, then resume with the same command: {resume_command(argv, run)}")


def out_of_memory_message(error: BaseException, datamodule) -> str:
    """One line: the batch each device took, and flags that take fewer images per device at a time and keep
    the images (and so the lr) of each optimizer step (vit.data.split_batch accepts them), then other ways."""
    trainer = getattr(datamodule, "trainer", None)
    total = getattr(datamodule, "batch_size", None)
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    rest = (f"a smaller --data.batch_size (the lr scales with it), --trainer.precision bf16-mixed, or more devices "
            f"(each takes a smaller share) ({first[:200]})")
    if trainer is None or not isinstance(total, int):
        return f"the accelerator ran out of memory with this batch. Try half the batch with twice " \
               f"--trainer.accumulate_grad_batches, {rest}"
    share, (flags, passes) = datamodule.process_batch(), smaller_passes(trainer, total)
    line = f"the accelerator ran out of memory with {share} images per device (the global batch {total} split " \
           f"among the processes)."
    if flags:
        return f"{line} Try {flags} (the same {total * trainer.accumulate_grad_batches} images and lr per optimizer " \
               f"step, {passes} per device at a time), {rest}"
    return f"{line} Each device already takes the fewest images the split allows; try {rest}"


def smaller_passes(trainer, total: int) -> tuple[str | None, int]:
    """The flags that divide ``total`` (the global batch) by the smallest factor the split among the Trainer's
    processes accepts, and multiply the accumulation by it, and the images per device they give; (None, 0)
    when no smaller share splits (vit.data.MIN_SHARE per process, even under Mixup/CutMix)."""
    from vit.data import split_batch
    from vit.exits import ConfigError

    world, k = trainer.world_size, trainer.accumulate_grad_batches
    pairs = getattr(trainer.lightning_module, "mixes_pairs", False)
    for factor in range(2, total + 1):
        if total % factor:
            continue
        try:
            share = split_batch(total // factor, world, pairs)
        except ConfigError:
            continue
        return f"--data.batch_size {total // factor} --trainer.accumulate_grad_batches {k * factor}", share
    return None, 0


def driver_report() -> str:
    """What the NVIDIA driver says of itself, in a few words."""
    try:
        out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20)
    except FileNotFoundError:
        return "no NVIDIA driver answers here (nvidia-smi is not installed)"
    except subprocess.TimeoutExpired:
        return "nvidia-smi did not answer within 20 s"
    import re

    driver = re.search(r"Driver Version:\s*(\S+)", out.stdout)
    cuda = re.search(r"CUDA Version:\s*(\S+)", out.stdout)
    if out.returncode != 0 or not driver:
        first = next((line for line in (out.stdout + out.stderr).splitlines() if line.strip()), "no output")
        return f"nvidia-smi fails: {first.strip()}"
    return f"the driver is {driver.group(1)}" + (f", for CUDA up to {cuda.group(1)}" if cuda else "")


def check_gpus_usable() -> None:
    """A job given GPUs (CUDA_VISIBLE_DEVICES, SLURM's gres) where torch cannot use them stops with one line
    (exit 2) instead of training on the CPU."""
    import torch

    given = launch.allocated_gpus()
    if given is None or torch.cuda.is_available():
        return
    built = f"torch {torch.__version__} is built for CUDA {torch.version.cuda}" if torch.version.cuda else \
        f"torch {torch.__version__} is a CPU-only build"
    raise AcceleratorUnusable(
        f"this job was given GPUs ({given}) but torch cannot use them: {built}, and {driver_report()}. Install a "
        f"torch built for this driver's CUDA (or load the cluster's own torch), or train on the CPU on purpose "
        f"with --trainer.accelerator cpu")


def nccl_errors_reach_python() -> None:
    """NCCL's watchdog, on a collective that outlives the process group's timeout, by default ends the process
    from its own thread (TORCH_NCCL_ASYNC_ERROR_HANDLING=3: SIGABRT, no message of ours). With 2 it aborts the
    communicator only, and the main thread's collective raises DistBackendError, which vit.commands.train turns
    into the same one line and exit 5 as gloo's timeouts. Set before the process group is made; a value the
    user set is kept."""
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")


def wandb_base_url() -> str:
    """The W&B server wandb logs to, found as wandb finds it: WANDB_BASE_URL (a self-hosted server), else the
    server `wandb login --host URL` saved in wandb's settings file (in WANDB_CONFIG_DIR, else
    ~/.config/wandb), else wandb's default."""
    url = os.environ.get("WANDB_BASE_URL")
    if not url:
        import wandb

        settings = wandb.Settings(silent=True)
        if hasattr(settings, "update_from_system_settings"):  # (wandb's reader of its settings files; older
            # wandb has none, and a run there checks its default server)
            settings.settings_system = str(Path(os.environ.get("WANDB_CONFIG_DIR") or "~/.config/wandb").expanduser()
                                           / "settings")
            settings.update_from_system_settings()
        url = settings.base_url
    return url.rstrip("/")


def wandb_unreachable(timeout: float) -> str | None:
    """Why the W&B server cannot be reached from here, or None when it answers within ``timeout`` seconds.
    It is asked what wandb asks it, a GraphQL query (no credentials sent): an answer counts only when it
    comes from a W&B server — a GraphQL answer, a success, or a 401 for the missing credentials — not a
    proxy's or gateway's 407, 403 or 5xx."""
    import json

    url = wandb_base_url()

    def from_wandb(status: int, body: bytes) -> bool:
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        return isinstance(answer, dict) and ("data" in answer or "errors" in answer) or \
            200 <= status < 300 or status == 401

    why = unreachable(f"{url}/graphql", timeout, data=b'{"query": "{ __typename }"}', accept=from_wandb)
    return why and f"{url} {why}"


def ca_context():
    """A TLS context that trusts what wandb's HTTP clients trust: the system's certificates or SSL_CERT_FILE /
    SSL_CERT_DIR (OpenSSL's variables, which wandb's uploader, wandb-core, reads too), and the bundle of
    REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE (read by requests, wandb's Python client). A variable that names no
    file or folder raises OSError naming it."""
    import ssl

    context = ssl.create_default_context()
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        bundle = os.environ.get(name)
        if bundle:
            try:
                if os.path.isdir(bundle):
                    context.load_verify_locations(capath=bundle)
                else:
                    context.load_verify_locations(cafile=bundle)
            except (OSError, ssl.SSLError) as e:
                raise OSError(f"{name}={bundle}: {getattr(e, 'strerror', None) or e}") from None
            break  # requests reads the first one set
    return context


def unreachable(url: str, timeout: float, data: bytes | None = None, accept=None) -> str | None:
    """Why ``url`` cannot be reached from here ("did not answer within ...", "cannot be reached (...)",
    "answered HTTP 407 ..."), or None when it answers within ``timeout`` seconds. ``data``: POSTed as JSON;
    ``accept(status, body)``: whether an answer is the server's own (default: any HTTP answer is). Proxies
    (https_proxy, no_proxy) and CA bundles (``ca_context``) are those of the environment. DNS, connect and
    the answer together are bounded: the probe runs in a thread that is left behind when it takes longer."""
    import urllib.error
    import urllib.request

    failed: list[str] = []

    def probe() -> None:
        request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=ca_context()) as answer:
                status, body = answer.status, answer.read(65536)
        except urllib.error.HTTPError as e:  # the server (or what stands in its way) answered
            status, body = e.code, b""
            try:
                body = e.read(65536) if e.fp else b""
            except OSError:  # (an answer cut short: its status still says who answered)
                pass
        except OSError as e:  # URLError, a refused or reset connection, a timeout, TLS, a CA bundle: no route there
            failed.append(f"cannot be reached ({getattr(e, 'reason', e)})")
            return
        if accept is not None and not accept(status, body):
            import http

            try:
                phrase = f" {http.HTTPStatus(status).phrase}"
            except ValueError:
                phrase = ""
            failed.append(f"answered HTTP {status}{phrase}, which is not the server's own answer (a proxy or gateway "
                          "in the way?)")

    thread = threading.Thread(target=probe, name="url-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return f"did not answer within {timeout:g} s"
    return failed[0] if failed else None
