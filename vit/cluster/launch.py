"""The launcher's allocation: whether SLURM or torchrun started this process, how many processes per node
on how many nodes it allocated, and the name its processes share for their run folder. The only module
that reads the launchers' environment variables."""

from __future__ import annotations

import os
import shlex
import sys
import threading
from datetime import timedelta
from typing import Callable, TypeVar

from vit.exits import BadInput, ConfigError, LostProcesses, Stopped, status_of

T = TypeVar("T")
MAX_REQUEUES = 20  # an array task's requeues before it says how to continue instead (as train.sbatch's default)
REQUEUER = "VIT_REQUEUER"  # what requeues this job when its run stops on SIGUSR1: set by the script that runs it
# The batch shell of a job lives through a SIGUSR1 sent to it too (`scancel --full`, `--signal=B:...`): without a
# trap bash dies of it (exit 138), and the job ends FAILED while its run, which got the signal from its step,
# stops where it resumes. The trap does nothing itself; srun's step, which SLURM signals, stops the run.
SHELL_TRAP = "trap : USR1  # the run stops on it; this shell stays to requeue the job"


def requeuer() -> str | None:
    """What requeues this job when its run stops where it resumes (exit 4), as the job's script says
    (train.sbatch, a plan's job array); None: nothing said so."""
    return os.environ.get(REQUEUER) or None


def array_script(name: str, commands: list[str]) -> str:
    """The body of a SLURM job array's script (``vit-plan submit``): task i runs ``commands[i]`` (a bash
    command line) as one step (srun), which gets SIGUSR1 before a time limit or a preemption; a run that
    stopped there (exit 4) requeues its task, which continues it."""
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
    """The id of the SLURM batch job this process is a task of (Lightning's own test: srun's
    SLURM_NTASKS, not an interactive allocation), whatever its number of tasks; else None."""
    env = os.environ
    if "SLURM_NTASKS" not in env or env.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return None
    if env.get("SLURM_ARRAY_JOB_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID")


def under_torchrun() -> bool:
    """Whether torchrun started this process, inside a SLURM job too: then torchrun's processes are the run's,
    not SLURM's tasks (as Lightning has it)."""
    return all(k in os.environ for k in ("TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE", "GROUP_RANK"))


def torchrun_id() -> str | None:
    """The rendezvous id of the torchrun launch this process belongs to (None without one: torchrun's "none")."""
    return os.environ["TORCHELASTIC_RUN_ID"] if under_torchrun() and os.environ["TORCHELASTIC_RUN_ID"] != "none" \
        else None


def attempt() -> str:
    """The launcher's restart count of this launch ("0" at its first start; a requeued SLURM job counts up, and
    torchrun's restarts inside one count after a dot: "1.2")."""
    slurm, elastic = (os.environ.get(key) or "0" for key in ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"))
    return slurm if elastic == "0" else f"{slurm}.{elastic}"


def launch_name() -> str | None:
    """The name of this launch that each of its attempts shares, and its run folder's: a SLURM job's
    (one task or many) or a torchrun's rendezvous id, so that a requeued or restarted launch finds its run and
    never another's; None for any other launch (process 0 names a new folder)."""
    job, rdzv = slurm_job(), torchrun_id()
    return f"slurm-{job}" if job else f"torchrun-{rdzv}" if rdzv else None


def allocation() -> tuple[int, int] | None:
    """(processes per node, nodes) as the launcher allocated them — a SLURM job's tasks, torchrun's
    --nproc-per-node and --nnodes — or None when no launcher started this process."""
    env = os.environ
    if under_torchrun():
        per_node = int(env["LOCAL_WORLD_SIZE"])
        return per_node, int(env["WORLD_SIZE"]) // per_node
    if slurm_job():
        nodes = int(env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", 1)))
        return int(env["SLURM_NTASKS"]) // nodes, nodes
    return None


def processes() -> int:
    """How many processes run this command together, as the launcher says (1 without one): torchrun's WORLD_SIZE
    (inside a SLURM job too); else any launcher's, srun's tasks of this step (in an interactive allocation too),
    or a SLURM batch job's tasks."""
    env = os.environ
    said = [env.get("WORLD_SIZE")] if under_torchrun() else \
        [env.get("WORLD_SIZE"), env.get("SLURM_STEP_NUM_TASKS"), slurm_job() and env.get("SLURM_NTASKS")]
    return max([int(n) for n in said if n and n.isdigit()], default=1)


def allocated_gpus() -> str | None:
    """The GPUs this process was given, as the variable that says so (``CUDA_VISIBLE_DEVICES=0,1``, SLURM's
    gres), or None when none was."""
    env = os.environ
    for key in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE"):
        value = env.get(key, "").strip()
        if value and value not in ("-1", "NoDevFiles") and not (key == "SLURM_GPUS_ON_NODE" and value == "0"):
            return f"{key}={value}"
    return None


def join_group(backend: str, timeout_seconds: float) -> None:
    """Where a launcher started the processes (torchrun, SLURM, or any that sets RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT), make the default process group here, as Lightning would make it, before the run's folder and
    checkpoint are decided: process 0 decides them and hands them to the others through it
    (vit.cluster.runs.open_for_fit). Lightning then uses the group it finds. A WORLD_SIZE over 1 with no way to
    reach the others is refused in one line.

    ``torchrun --max-restarts`` restarts the group against the same store, its agent's. Each worker writes its
    address into that store; torch 2.14 keys them the same in every attempt, so a restarted worker can read the
    address of a worker of the previous attempt and fail to connect (gloo: "Connection refused" to a dead
    worker's port; reproduced with a 10-line torch script, no Lightning). A ``PrefixStore`` named after
    torchrun's attempt keeps the attempts apart."""
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
            dist.init_process_group(backend, timeout=timeout)  # (each torchrun attempt's rank 0 hosts a new store)
        else:
            raise ConfigError(f"WORLD_SIZE is {env['WORLD_SIZE']} but RANK, LOCAL_RANK, MASTER_ADDR or MASTER_PORT is "
                              f"not set: start the processes with torchrun or srun")
    else:
        from lightning.pytorch.plugins.environments import SLURMEnvironment

        slurm = SLURMEnvironment()  # (its address and port, as Lightning's own group under SLURM takes them)
        if slurm.world_size() < 2:
            return
        env["MASTER_ADDR"], env["MASTER_PORT"] = slurm.main_address, str(slurm.main_port)
        dist.init_process_group(backend, rank=slurm.global_rank(), world_size=slurm.world_size(), timeout=timeout)
    atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())  # (as Lightning does)
    # every process is here within the time limit (NCCL's group is made without waiting for them all), then the
    # group without a practical one is made at once; the first is kept (destroyed at once, it would close the
    # connections that a process still making it waits on)
    dist.new_group(backend="gloo", timeout=timeout)
    patient_group()


def peers_store():
    """A client of the store the process group was made with (its host: MASTER_ADDR, MASTER_PORT, as every
    launcher sets them), for what the processes tell each other outside collectives (Watchdog); None without
    a process group. Keys are per torchrun attempt (its agent's store outlives an attempt)."""
    from datetime import timedelta

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


def apply_allocation(trainer) -> None:
    """Under SLURM or torchrun the processes exist already: devices and nodes are the allocation's,
    whatever the recipe says (one line says what it overrode)."""
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
    """The Trainer's strategy and plugins for this launch: DDP with ``ddp_timeout`` seconds on its process
    group where more than one process trains, whose steps issue no collective but the gradients' all-reduce;
    checkpoints written atomically (vit.cluster.checkpoint_io); under SLURM, Lightning's own preemption handler off
    (it deadlocks DDP: vit.training.guards.StopOnSignal handles SIGUSR1)."""
    from datetime import timedelta

    from lightning.pytorch.plugins.environments import SLURMEnvironment

    from vit.cluster.checkpoint_io import AtomicCheckpointIO

    kwargs = {}
    devices, nodes = trainer.get("devices", "auto"), trainer.get("num_nodes", 1)
    count = devices if isinstance(devices, int) else len(devices) if isinstance(devices, list) else \
        int(devices) if str(devices).isdigit() else 1
    strategy = trainer.get("strategy", "auto")
    if strategy == "ddp" or (strategy == "auto" and count * nodes > 1):
        from lightning.pytorch.strategies import DDPStrategy

        # broadcast_buffers off: the model's buffers (the normalisation's mean and std) never change, and DDP would
        # broadcast them from rank zero before every forward, a collective in every step
        kwargs["strategy"] = DDPStrategy(timeout=timedelta(seconds=ddp_timeout), broadcast_buffers=False)
    plugins = trainer.get("plugins") or []
    kwargs["plugins"] = [*(plugins if isinstance(plugins, list) else [plugins]), AtomicCheckpointIO(),
                         *([SLURMEnvironment(auto_requeue=False)] if slurm_job() and not under_torchrun() else [])]
    return kwargs


def from_process_zero(make: Callable[[], T], what: str) -> T:
    """``make()`` run by process 0 only, its result (or its BadInput error) given to every process. One
    broadcast, on ``patient_group``: the others wait for as long as process 0 works (it checks a folder's
    images, say), and say so once a minute (waiting for process 0's ``what``). Process 0 failing otherwise ends
    them with a line naming its error (exit 5) before it raises that error itself; a process gone ends the
    others at once (its connections close), never a silent hang."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return make()
    box: list = [None]
    rank, world = dist.get_rank(), dist.get_world_size()
    # a long wait is said once a minute, by process 1 for all the others (process 0 says what it does: its
    # index read, or every image checked), so that a job's one log gets one line a minute
    others = "process 1" if world == 2 else f"processes 1 to {world - 1}"
    waiting = _Every(60.0, f"{others}: still waiting for process 0's {what}") if rank == 1 else None
    failed = None
    try:
        group = patient_group()
        if rank == 0:
            try:
                box[0] = make()
            except (BadInput, Stopped) as e:  # (a bad input, or SIGUSR1 before training: every process's)
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


_patient: list = []  # (the process group, patient_group's group of it)


def patient_group():
    """A gloo group of every process without a practical time limit (as Lightning's prepare_data barrier), for
    ``from_process_zero``; made once, with the process group (``join_group``; else at the first
    ``from_process_zero``, which every process calls in the same order). Its connections are made while every
    process is there, so that a broadcast on it ends at once when one has ended since (a group made later would
    wait for that one to join it)."""
    import torch.distributed as dist

    if not _patient or _patient[0] is not dist.group.WORLD:
        _patient[:] = [dist.group.WORLD, dist.new_group(backend="gloo", timeout=timedelta(days=10))]
    return _patient[1]


class _Every:
    """``line`` on stderr every ``seconds`` from a daemon thread, with the minutes waited, until stop()."""

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
