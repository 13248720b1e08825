"""What SLURM or torchrun says about this launch, and its process group; the only reader of their variables."""

from __future__ import annotations

import os
import shlex
import sys
import threading
from datetime import timedelta
from typing import Callable, TypeVar

from vit.exits import BadInput, ConfigError, LostProcesses, Stopped, status_of

T = TypeVar("T")
MAX_REQUEUES = 20  # per array task, as train.sbatch's default
REQUEUER = "VIT_REQUEUER"  # set by the job script: what requeues the job when its run stops on SIGUSR1
# SIGUSR1 may reach the batch shell too (`scancel --full`, `--signal=B:...`); untrapped, bash dies (exit 138) and
# the job ends FAILED instead of requeueing. The run itself is stopped through its srun step.
SHELL_TRAP = "trap : USR1  # the run stops on it; this shell stays to requeue the job"


def requeuer() -> str | None:
    """What requeues this job when its run stops to resume (exit 4), as the job script says; else None."""
    return os.environ.get(REQUEUER) or None


def array_script(name: str, commands: list[str]) -> str:
    """A SLURM job array script (``vit-plan submit``): task i runs ``commands[i]`` as one srun step and
    requeues itself when its run stopped on SIGUSR1 (exit 4)."""
    arms = "\n".join(f"  {i}) {command} ;;" for i, command in enumerate(commands))
    return f"""set -euo pipefail
{SHELL_TRAP}
export {REQUEUER}={shlex.quote(f"the job array of {name} (vit-plan submit)")}
echo "task ${{SLURM_ARRAY_TASK_ID}} of {name} (restart ${{SLURM_RESTART_COUNT:-0}}) on $(hostname): $(date -Is)"
status=0
case "${{SLURM_ARRAY_TASK_ID}}" in
{arms}
  *) echo "task ${{SLURM_ARRAY_TASK_ID}}: {name} has runs 0 to {len(commands) - 1}" >&2; exit 2 ;;
esac
if [ "$status" = {status_of(Stopped())} ]; then  # stopped at a step boundary, saved (SIGUSR1 before a time limit, a preemption)
  if [ "${{SLURM_RESTART_COUNT:-0}}" -ge {MAX_REQUEUES} ]; then
    echo "not requeueing task ${{SLURM_ARRAY_TASK_ID}}: requeued {MAX_REQUEUES} times; submit the plan again to continue"
  else
    echo "requeueing task ${{SLURM_ARRAY_TASK_ID}} (job ${{SLURM_JOB_ID}}): it resumes from its run folder"
    scontrol requeue "${{SLURM_JOB_ID}}"
  fi
fi
exit "$status"
"""


def slurm_job() -> str | None:
    """This process's SLURM batch job id (``<job>_<task>`` in an array); None outside one or when interactive."""
    env = os.environ
    if "SLURM_NTASKS" not in env or env.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return None
    if env.get("SLURM_ARRAY_JOB_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID")


def under_torchrun() -> bool:
    """Whether torchrun started this process; inside a SLURM job, torchrun's processes win (as in Lightning)."""
    return all(k in os.environ for k in ("TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE", "GROUP_RANK"))


def torchrun_id() -> str | None:
    """This torchrun's rendezvous id; None without torchrun or with its default "none"."""
    return os.environ["TORCHELASTIC_RUN_ID"] if under_torchrun() and os.environ["TORCHELASTIC_RUN_ID"] != "none" \
        else None


def attempt() -> str:
    """The launcher's restart count: "0" at first; SLURM requeues count up, torchrun restarts after a dot ("1.2")."""
    slurm, elastic = (os.environ.get(key) or "0" for key in ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"))
    return slurm if elastic == "0" else f"{slurm}.{elastic}"


def launch_name() -> str | None:
    """``slurm-<job>`` or ``torchrun-<id>``, shared by all attempts so a requeued launch finds its run; else None."""
    job, rdzv = slurm_job(), torchrun_id()
    return f"slurm-{job}" if job else f"torchrun-{rdzv}" if rdzv else None


def allocation() -> tuple[int, int] | None:
    """(processes per node, nodes) as SLURM or torchrun allocated them; None without a launcher."""
    env = os.environ
    if under_torchrun():
        per_node = int(env["LOCAL_WORLD_SIZE"])
        return per_node, int(env["WORLD_SIZE"]) // per_node
    if slurm_job():
        nodes = int(env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", 1)))
        return int(env["SLURM_NTASKS"]) // nodes, nodes
    return None


def processes() -> int:
    """How many processes run this command together, per the launcher (1 without one; torchrun wins in SLURM)."""
    env = os.environ
    said = [env.get("WORLD_SIZE")] if under_torchrun() else \
        [env.get("WORLD_SIZE"), str(step_tasks()), slurm_job() and env.get("SLURM_NTASKS")]
    return max([int(n) for n in said if n and n.isdigit()], default=1)


def step_tasks() -> int:
    """The tasks of this srun step that run this command: 1 in an ``srun --pty`` shell, whose other tasks end (a
    step started from that shell inherits SLURM_PTY_PORT, not the terminal)."""
    tasks = os.environ.get("SLURM_STEP_NUM_TASKS", "")
    pty = os.environ.get("SLURM_PTY_PORT") and sys.stdin is not None and sys.stdin.isatty()
    return int(tasks) if tasks.isdigit() and not pty else 1


def check_slurm_tasks() -> None:
    """Refuse, in one line, the SLURM tasks that Lightning would not train as one run: the tasks of an srun step
    in an interactive job (named ``bash`` or ``interactive``: each would train a run of its own), and a job's
    several tasks without ``--ntasks-per-node`` (Lightning's SLURM environment needs it)."""
    env, tasks = os.environ, step_tasks()
    if under_torchrun() or "WORLD_SIZE" in env:
        return
    if tasks > 1 and not slurm_job():
        raise ConfigError(f"this srun step starts {tasks} tasks in an interactive job (named "
                          f"{env.get('SLURM_JOB_NAME')}), which Lightning would train as {tasks} separate runs: "
                          f"name the step to train one run on all of them (srun --job-name NAME --ntasks-per-node "
                          f"{tasks // max(1, int(env.get('SLURM_STEP_NUM_NODES', 1)))}), or start one task")
    if slurm_job() and int(env.get("SLURM_NTASKS", 1)) > 1 and "SLURM_NTASKS_PER_NODE" not in env:
        raise ConfigError(f"this SLURM job runs {env['SLURM_NTASKS']} tasks and says no tasks per node, which "
                          f"Lightning needs: ask for them with --nodes and --ntasks-per-node instead of --ntasks")


def allocated_gpus() -> str | None:
    """The variable that gives this process its GPUs, e.g. ``CUDA_VISIBLE_DEVICES=0,1``; None if none does."""
    env = os.environ
    for key in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE"):
        value = env.get(key, "").strip()
        if value and value not in ("-1", "NoDevFiles") and not (key == "SLURM_GPUS_ON_NODE" and value == "0"):
            return f"{key}={value}"
    return None


def join_group(backend: str, timeout_seconds: float) -> None:
    """Make the default process group, as Lightning would, before the run folder is decided: process 0 hands its
    decision over it (runs.open_for_fit). Every process calls it; a WORLD_SIZE over 1 that names no way to reach
    the others is refused in one line. All ``torchrun --max-restarts`` attempts share the agent's store and
    torch 2.14 keys worker addresses alike in each, so a restarted worker may dial a dead one ("Connection
    refused"); a per-attempt ``PrefixStore`` keeps attempts apart."""
    import atexit

    import torch.distributed as dist

    env, timeout = os.environ, timedelta(seconds=timeout_seconds)
    if dist.is_initialized():
        return
    if under_torchrun() or not slurm_job():
        if int(env.get("WORLD_SIZE", 1)) < 2:
            return
        if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            agent = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=timeout)
            store = dist.PrefixStore(f"vit/attempt_{env.get('TORCHELASTIC_RESTART_COUNT', '0')}", agent)
            dist.init_process_group(backend, store=store, rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]),
                                    timeout=timeout)
        elif all(key in env for key in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")):
            dist.init_process_group(backend, timeout=timeout)  # (each attempt's rank 0 hosts a new store)
        else:
            raise ConfigError(f"WORLD_SIZE is {env['WORLD_SIZE']} but RANK, LOCAL_RANK, MASTER_ADDR or MASTER_PORT is "
                              f"not set: start the processes with torchrun or srun")
    else:
        from lightning.pytorch.plugins.environments import SLURMEnvironment

        slurm = SLURMEnvironment()  # (the address and port Lightning uses under SLURM)
        if slurm.world_size() < 2:
            return
        env["MASTER_ADDR"], env["MASTER_PORT"] = slurm.main_address, str(slurm.main_port)
        dist.init_process_group(backend, rank=slurm.global_rank(), world_size=slurm.world_size(), timeout=timeout)
    atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())  # (as Lightning does)
    # every process makes the patient group and leaves once all have (one that fails at once would otherwise reset
    # the connections another is still opening); neither waits on a time limit, so one that has not joined within
    # ours (it ended, or is stuck) ends this process
    joined, gate = threading.Event(), threading.Lock()
    threading.Thread(target=_join_or_end, args=(joined, gate, dist.get_rank(), timeout_seconds), name="vit-join",
                     daemon=True).start()
    try:
        dist.barrier(group=patient_group())
    finally:
        with gate:
            joined.set()


def _join_or_end(joined: threading.Event, gate: threading.Lock, rank: int, seconds: float) -> None:
    """End this process (exit 5) unless ``joined`` is set within ``seconds`` (set under ``gate``)."""
    joined.wait(seconds)
    with gate:
        if joined.is_set():
            return
        try:  # (a stream that fails must not keep this process waiting)
            sys.stdout.flush()
            print(f"error: process {rank}: the other processes of this run did not all join it within {seconds:g} "
                  f"s: one of them ended (see its own error above), is stuck as it starts, or cannot be reached (see "
                  f"docs/clusters.md on GLOO_SOCKET_IFNAME); the run stopped instead of waiting", file=sys.stderr,
                  flush=True)
        finally:
            os._exit(status_of(LostProcesses()))


def peers_store():
    """A client of the process group's store for messages outside collectives (Watchdog), keyed per attempt."""
    import torch.distributed as dist

    env = os.environ
    if not (dist.is_available() and dist.is_initialized()) or "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
        return None
    try:
        store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                              timeout=timedelta(seconds=30))
    except dist.DistError:
        return None
    return dist.PrefixStore(f"vit/peers/attempt_{env.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


FAILED, READ = "failed", "read"  # in peers_store: the first failure told (status, rank, line); how many read it
ACKS = 10.0  # how long the first to fail waits for the others to read it (process 0 hosts the store)


def say_failure(status: int, line: str, shown: str | None, alike: bool) -> None:
    """Print ``shown`` (None: nothing, a bug's traceback says it) once for all processes that fail alike, and tell
    the others, whose Watchdog then ends them with it. In a process group, the first process to fail tells it
    through the group's store and prints it; a later one prints only a failure of its own (a node's missing
    data, say). Before a group exists only the command line was read, alike everywhere: process 0 prints
    ``alike`` failures for all."""
    import time

    import torch.distributed as dist
    from lightning.pytorch.utilities import rank_zero_only

    grouped = dist.is_available() and dist.is_initialized()
    store = peers_store()
    rank = dist.get_rank() if grouped else rank_zero_only.rank
    mine = f"{status}\t{rank}\t{' '.join(line.split())}"
    try:
        first = store and store.compare_set(FAILED, "", mine).decode()
        if first and first != mine:
            store.add(READ, 1)
    except dist.DistError:  # process 0, the store's host, is gone
        first = None
    elsewhere = first != mine and first.split("\t", 2)[::2] == mine.split("\t", 2)[::2] if first else \
        rank != 0 and alike and not grouped  # (a group whose store is gone: each says its own)
    if shown is not None and not elsewhere:
        print(shown, file=sys.stderr, flush=True)
    deadline = time.monotonic() + ACKS
    try:
        while first == mine and store.add(READ, 0) < dist.get_world_size() - 1 and time.monotonic() < deadline:
            time.sleep(0.1)
    except dist.DistError:
        pass


def apply_allocation(trainer) -> None:
    """Under SLURM or torchrun, set the Trainer's devices and nodes to the allocation, whatever the recipe says."""
    allocated = allocation()
    if allocated is None:
        return
    from lightning.pytorch.utilities import rank_zero_info

    devices, nodes = allocated
    overridden = [f"{key} {getattr(trainer, key)}" for key, value in (("devices", devices), ("num_nodes", nodes))
                  if str(getattr(trainer, key)) != str(value)]
    trainer.devices, trainer.num_nodes = devices, nodes
    if devices * nodes > 1 and trainer.strategy == "auto":
        trainer.strategy = "ddp"
    launcher = (f"torchrun {torchrun_id() or '(no --rdzv-id)'}" if under_torchrun() else f"SLURM job {slurm_job()}")
    rank_zero_info(f"{launcher}: {devices} process(es) per node on {nodes} node(s)"
                   + (f" (the allocation's; the recipe's {' and '.join(overridden)} overridden)" if overridden else ""))


def parallelism(trainer: dict, ddp_timeout: float) -> dict:
    """The Trainer's strategy and plugins: DDP with ``ddp_timeout`` when several processes train, atomic
    checkpoints, and under SLURM Lightning's requeue handler off (it deadlocks DDP; StopOnSignal handles SIGUSR1)."""
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    from vit.cluster.checkpoint_io import AtomicCheckpointIO

    kwargs = {}
    devices, nodes = trainer.get("devices", "auto"), trainer.get("num_nodes", 1)
    count = devices if isinstance(devices, int) else len(devices) if isinstance(devices, list) else \
        int(devices) if str(devices).isdigit() else 1
    strategy = trainer.get("strategy", "auto")
    if strategy == "ddp" or (strategy == "auto" and count * nodes > 1):
        from lightning.pytorch.strategies import DDPStrategy

        # the buffers (normalisation mean and std) never change: no broadcast of them before every forward
        kwargs["strategy"] = DDPStrategy(timeout=timedelta(seconds=ddp_timeout), broadcast_buffers=False)
    plugins = trainer.get("plugins") or []
    kwargs["plugins"] = [*(plugins if isinstance(plugins, list) else [plugins]), AtomicCheckpointIO(),
                         *([SLURMEnvironment(auto_requeue=False)] if slurm_job() and not under_torchrun() else [])]
    return kwargs


def from_process_zero(make: Callable[[], T], what: str) -> T:
    """Run ``make()`` on process 0 only and give its result (or BadInput/Stopped) to every process, in one
    broadcast on ``patient_group`` (every process calls it, in the same order). The others wait as long as
    process 0 works, logging once a minute; any other failure of process 0 ends them with a line naming it
    (exit 5), and a process that dies ends the others at once."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return make()
    box: list = [None]
    rank, world = dist.get_rank(), dist.get_world_size()
    # process 1 speaks for all waiting processes: one line a minute in the job's log
    others = "process 1" if world == 2 else f"processes 1 to {world - 1}"
    waiting = _Every(60.0, f"{others}: still waiting for process 0's {what}") if rank == 1 else None
    failed = None
    try:
        group = patient_group()
        if rank == 0:
            try:
                box[0] = make()
            except (BadInput, Stopped) as e:  # (a bad input or an early SIGUSR1: every process raises it)
                box[0] = e
            except Exception as e:  # noqa: BLE001 - raised again below, once the others know it
                failed, first = e, (str(e).splitlines() or [""])[0]
                box[0] = LostProcesses(f"process 0 failed while it made its {what} ({type(e).__name__}: {first}); "
                                       f"it says why")
        dist.broadcast_object_list(box, src=0, group=group)
    finally:
        if waiting is not None:
            waiting.stop()
    if failed is not None:
        raise failed
    if isinstance(box[0], (BadInput, LostProcesses, Stopped)):
        raise box[0]
    return box[0]


_patient: list = []  # [the process group, its patient group]


def patient_group():
    """A gloo group of all processes with no practical time limit, for ``from_process_zero``. Made once per
    process group, while every process is there (every process calls this in the same order), so a broadcast
    on it fails at once if one has ended since; a group made later would wait for it to join."""
    import torch.distributed as dist

    if not _patient or _patient[0] is not dist.group.WORLD:
        _patient[:] = [dist.group.WORLD, dist.new_group(backend="gloo", timeout=timedelta(days=10))]
    return _patient[1]


class _Every:
    """Print ``line`` with the minutes waited to stderr every ``seconds`` until stop()."""

    def __init__(self, seconds: float, line: str):
        self.seconds, self.line, self.done = seconds, line, threading.Event()
        self.thread = threading.Thread(target=self._run, name="vit-waits-for-process-0", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        waited = 0.0
        while not self.done.wait(self.seconds):
            waited += self.seconds
            print(f"{self.line} ({waited / 60:.0f} min)", file=sys.stderr, flush=True)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()  # (no line after this returns)
