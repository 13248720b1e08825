"""What a launcher (SLURM, torchrun) decides, in this process: the run folder and the allocation."""

import os
from pathlib import Path

import pytest
import torch

from vit import configs
from vit.cluster import launch, run_lock, runs

SLURM_JOB = {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "4", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS_PER_NODE": "2",
             "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_NAME": "vit-cifar10",
             "SLURM_NODELIST": "vm", "SLURM_CPUS_ON_NODE": "2"}
LAUNCH_VARS = [*SLURM_JOB, "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE",
               "GROUP_RANK", "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", runs.ENV, runs.RESUMES]


@pytest.fixture
def no_launcher(monkeypatch):
    for key in LAUNCH_VARS:  # set first, so that whatever the test sets (VIT_RUN_DIR too) is undone after it
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    return monkeypatch


def test_every_slurm_job_has_its_own_run_name_even_with_one_task(no_launcher):
    no_launcher.setenv("SLURM_JOB_ID", "5")
    no_launcher.setenv("SLURM_NTASKS", "1")
    no_launcher.setenv("SLURM_JOB_NAME", "vit-cifar10")
    assert launch.launch_name() == "slurm-5" and launch.allocation() == (1, 1)
    no_launcher.setenv("SLURM_JOB_NAME", "interactive")  # an salloc shell: not a batch job's task
    assert launch.launch_name() is None and launch.allocation() is None
    no_launcher.setenv("SLURM_JOB_NAME", "vit-cifar10")
    no_launcher.setenv("SLURM_ARRAY_JOB_ID", "9")
    no_launcher.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert launch.launch_name() == "slurm-9_3"


def test_a_one_task_job_resumes_only_its_own_run(no_launcher, tmp_path):
    other = tmp_path / "version_0" / "checkpoints"
    other.mkdir(parents=True)
    torch.save({"state_dict": {}, "run": "another run's", "callbacks": {"TrainingClock": {"steps": 0}},
                "CIFAR10DataModule": {"epoch": 0, "images": 0, "skipped_images": 0}}, other / "last.ckpt")
    no_launcher.setenv("SLURM_JOB_ID", "6")
    no_launcher.setenv("SLURM_NTASKS", "1")
    try:
        run, resume = runs.open_for_fit(tmp_path, "last", None, {}, {}, [])
        assert run == tmp_path / "slurm-6" and resume is None  # not version_0's last.ckpt
        run, (ckpt, read) = runs.open_for_fit(tmp_path, "last", "version_0", {}, {}, [])  # unless the user names it
        assert run == tmp_path / "version_0" and ckpt == other / "last.ckpt" and read["run"] == "another run's"
    finally:
        run_lock.release()


def test_torchrun_names_the_run_and_gives_the_allocation(no_launcher):
    for key, value in {"TORCHELASTIC_RUN_ID": "pair", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
                       "WORLD_SIZE": "8"}.items():
        no_launcher.setenv(key, value)
    assert launch.launch_name() == "torchrun-pair" and launch.allocation() == (4, 2)


@pytest.mark.parametrize("recipe", configs.names())
def test_every_recipe_takes_devices_and_nodes_from_the_slurm_allocation(recipe, no_launcher, tmp_path):
    """A 2-node × 2-task job: whatever the recipe says (smoke and cpu: devices 1), the Trainer gets 2 × 2,
    DDP with --ddp_timeout, and Lightning's own SLURM requeue handler off (vit.training.guards.StopOnSignal)."""
    from lightning.pytorch.plugins.environments import SLURMEnvironment
    from lightning.pytorch.strategies import DDPStrategy

    from vit.commands.train import ViTCLI

    from vit.cluster import launch

    for key, value in SLURM_JOB.items():
        no_launcher.setenv(key, value)
    joined = []  # (one process here: the job's 4 join their group in tests/cluster)
    no_launcher.setattr(launch, "join_group", lambda *args: joined.append(args))
    cli = ViTCLI("fit", ["--config", recipe, "--data.root", str(tmp_path / "data"), "--trainer.logger", "false",
                         "--trainer.default_root_dir", str(tmp_path / "runs"), "--ddp_timeout", "42",
                         "--trainer.accelerator", "cpu"], [])
    trainer = cli.trainer
    assert (trainer.num_devices, trainer.num_nodes, trainer.world_size) == (2, 2, 4)
    # the collectives' timeout is a backstop behind the watchdog's (vit.training.guards.Watchdog)
    assert isinstance(trainer.strategy, DDPStrategy) and trainer.strategy._timeout.total_seconds() == 42 + 60
    environment = trainer.strategy.cluster_environment
    assert isinstance(environment, SLURMEnvironment) and not environment.auto_requeue
    assert (tmp_path / "runs" / "slurm-77").is_dir()  # (the line it prints: tests/cluster/test_slurm.py)
    assert joined == [("gloo", 42 + 60)]  # before the folder was decided, with the collectives' timeout


def _ask_wandb_id(run: str) -> str:
    return runs.wandb_id(Path(run))


def test_a_run_folder_keeps_one_wandb_id_whoever_asks_first(tmp_path):
    """Every process of a job asks at once: all get the one id written first; a later attempt (a requeued
    job that never wrote a checkpoint) gets it again; an older checkpoint's id is kept."""
    from concurrent.futures import ProcessPoolExecutor

    run = tmp_path / "slurm-7"
    run.mkdir()
    with ProcessPoolExecutor(4) as pool:
        ids = set(pool.map(_ask_wandb_id, [str(run)] * 16))
    assert len(ids) == 1 and runs.wandb_id(run) in ids
    assert sorted(p.name for p in run.iterdir()) == ["wandb_id"]  # no draft left behind
    older = tmp_path / "version_0"
    older.mkdir()
    assert runs.wandb_id(older, known="abc123") == "abc123" == runs.wandb_id(older)


def test_new_wandb_ids_read_back_from_config_yaml_as_strings(tmp_path):
    """A run's W&B id goes into its config.yaml, which vit-report reads back with jsonargparse's YAML loader:
    an id of hex digits such as 65e28918 came back as a float (inf)."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--id", type=str)
    for i in range(200):
        (tmp_path / str(i)).mkdir()
        new = runs.wandb_id(tmp_path / str(i))
        assert len(new) == 9 and new[0].isalpha() and parser.parse_string(f"id: {new}").id == new
    with pytest.raises(Exception, match="inf"):  # (what a hex id did)
        parser.parse_string("id: 65e28918")


SRUN_TASK = {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
             "SLURM_JOB_NAME": "train", "SLURM_NODELIST": "vm"}
TORCHRUN = {"TORCHELASTIC_RUN_ID": "none", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "0", "RANK": "3", "LOCAL_RANK": "3",
            "WORLD_SIZE": "4",
            "MASTER_ADDR": "host", "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "2"}


@pytest.mark.parametrize("env,joined", [
    (SRUN_TASK, ("rank 1 of 2", "vm")),  # task 1 of a SLURM job of 2: SLURM's ranks, Lightning's address
    ({**SRUN_TASK, **TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "True"}, ("rank 3 of 4", "vit/attempt_2")),
    ({**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "False"}, ("env://", "host")),  # each attempt's rank 0 hosts one
    ({**SRUN_TASK, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}, None),  # one task: no group
    ({**SRUN_TASK, "SLURM_JOB_NAME": "interactive"}, None),  # srun in an interactive allocation: not a job's task
    ({**TORCHRUN, "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}, None),
    ({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "host", "MASTER_PORT": "29500"},
     "WORLD_SIZE is 2 but RANK, LOCAL_RANK, MASTER_ADDR or MASTER_PORT is not set"),  # (Lightning needs LOCAL_RANK)
])
def test_the_processes_join_the_group_their_launcher_made_them_for(no_launcher, env, joined):
    """join_group: torchrun's processes (inside a SLURM job too, with its agent's store under a prefix per attempt)
    before SLURM's tasks; no group for one process; a WORLD_SIZE with no way to reach the others refused."""
    import torch.distributed as dist

    from vit.cluster import launch
    from vit.exits import ConfigError

    made = []
    for key, value in env.items():
        no_launcher.setenv(key, value)
    no_launcher.setattr(dist, "is_initialized", lambda: False)
    no_launcher.setattr(dist, "TCPStore", lambda host, port, **kwargs: host)
    no_launcher.setattr(dist, "PrefixStore", lambda prefix, store: prefix)
    no_launcher.setattr(dist, "init_process_group", lambda backend, store=None, rank=None, world_size=None, timeout=None:
                        made.append((f"rank {rank} of {world_size}" if rank is not None else "env://",
                                     store or os.environ["MASTER_ADDR"], backend, timeout.total_seconds())))
    at_exit, patient = [], []
    no_launcher.setattr("atexit.register", at_exit.append)
    no_launcher.setattr(dist, "get_rank", lambda: 0)
    no_launcher.setattr(launch, "patient_group", lambda: patient.append(len(made)) or "patient")  # (after the group)
    no_launcher.setattr(dist, "barrier", lambda group: patient.append(group))
    if isinstance(joined, str):
        with pytest.raises(ConfigError, match=f"^{joined}: start the processes with torchrun or srun"):
            launch.join_group("gloo", 60)
        return
    launch.join_group("nccl", 60)
    assert made == ([(*joined, "nccl", 60)] if joined else []) and len(  # (destroyed at exit)
        [f for f in at_exit if f.__qualname__.startswith("join_group")]) == len(made)
    # from_process_zero's group is made, and every process leaves once all have made it
    assert patient == ([1, "patient"] if joined else [])


# process RANK of 2 joins their group with a time limit of 5 s, once both are ready (their imports done: the limit
# bounds the group's making too); with DIES=1, process 1 dies after the process group is made and before it joins
# from_process_zero's group; else both outlive the time limit, joined
JOIN = """
import os, sys, time
from pathlib import Path
from vit.cluster import launch
import torch.distributed
if os.environ["RANK"] == "1" and os.environ.get("DIES"):
    launch.patient_group = lambda: os._exit(3)
(Path(sys.argv[1]) / os.environ["RANK"]).touch()
while len(list(Path(sys.argv[1]).iterdir())) < 2:
    time.sleep(0.05)
launch.join_group("gloo", 5)
time.sleep(7)
print("joined", flush=True)
"""


@pytest.mark.parametrize("dies", [True, False])
def test_a_process_that_dies_as_the_group_is_made_ends_the_others_within_the_time_limit(dies, no_launcher, tmp_path):
    """join_group: the group without a time limit (from_process_zero's) is made under ours, so a process that
    dies before it joins ends the others in one line (exit 5), not after days; once all have joined, the time
    limit ends nobody."""
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", JOIN, str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "DIES": "1" if dies else ""})
             for rank in range(2)]
    try:
        (out, err), _ = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    if not dies:
        assert [proc.returncode for proc in procs] == [0, 0] and out == "joined\n", err
        return
    assert [proc.returncode for proc in procs] == [5, 3] and out == "" and time.monotonic() - started < 100
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        "error: process 0: the other processes of this run did not all join it within 5 s: one of them ended (see its "
        "own error above), is stuck as it starts, or cannot be reached (see docs/clusters.md on GLOO_SOCKET_IFNAME); "
        "the run stopped instead of waiting"]


def test_torchrun_inside_a_slurm_job_is_torchruns_launch(no_launcher):
    """torchrun's 4 processes in a SLURM job of 1 task are the run's (as Lightning's TorchElasticEnvironment has
    it): the allocation is torchrun's, and SLURM's environment plugin, whose ranks are the tasks', is not given."""
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    from vit.cluster import launch

    for key, value in {**SRUN_TASK, "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1", "SLURM_PROCID": "0",
                       **TORCHRUN}.items():
        no_launcher.setenv(key, value)
    assert launch.allocation() == (4, 1)
    plugins = launch.parallelism({"devices": 4, "num_nodes": 1}, 60)["plugins"]
    assert not any(isinstance(plugin, SLURMEnvironment) for plugin in plugins)
    no_launcher.delenv("TORCHELASTIC_RUN_ID")  # (SLURM's own task)
    assert launch.allocation() == (1, 1)
    assert any(isinstance(plugin, SLURMEnvironment) for plugin in launch.parallelism({}, 60)["plugins"])


@pytest.mark.parametrize("env, count", [
    (SLURM_JOB, 4), ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}, 2),
    ({"TORCHELASTIC_RUN_ID": "t", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "WORLD_SIZE": "2"}, 2),
    ({**SLURM_JOB, "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_JOB_NUM_NODES": "4"}, 2),  # srun -n 2 of 4 nodes
    ({"SLURM_JOB_NAME": "interactive", "SLURM_NTASKS": "3", "SLURM_STEP_NUM_TASKS": "3"}, 3),  # srun -n 3 in salloc
    ({**SLURM_JOB, "SLURM_NTASKS": "1", "SLURM_JOB_NUM_NODES": "1"}, 1), ({"WORLD_SIZE": "1"}, 1), ({}, 1),
    ({**SLURM_JOB, "TORCHELASTIC_RUN_ID": "t", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0", "WORLD_SIZE": "1"}, 1)])
def test_a_test_under_a_launcher_of_several_processes_is_refused_before_any_folder(env, count, no_launcher, tmp_path,
                                                                                    capsys):
    """Each process would test the checkpoint and write its record on its own: one line, exit 2, no folder;
    one process goes on (to the checkpoint, missing here)."""
    from vit.commands.train import main

    no_launcher.delenv("SLURM_STEP_NUM_TASKS", raising=False)
    for key, value in env.items():
        no_launcher.setenv(key, value)
    no_launcher.chdir(tmp_path)
    code = main(["test", "--ckpt_path", str(tmp_path / "none.ckpt"), "--trainer.logger", "false",
                 "--trainer.accelerator", "cpu", "--data.root", str(tmp_path / "data")])
    error = capsys.readouterr().err
    assert code == 2 and list(tmp_path.iterdir()) == [] and launch.processes() == count
    refused = f"test evaluates on one process, and this launch has {count}: start it as one"
    assert (refused in error) == (count > 1) and ("no such checkpoint file" in error) == (count == 1), error


def test_a_failure_is_printed_once_by_the_first_process_that_fails(no_launcher, capsys):
    """A failure's line is printed once for all processes that fail alike. In a process group, the first to fail
    writes it into the group's store and prints it; a process failing alike after it prints nothing, one failing
    otherwise (its node's data is missing) prints its own. Before a group exists, process 0 alone prints a
    failure every process meets alike (the command line's)."""
    import socket

    import torch.distributed as dist
    from lightning.pytorch.utilities import rank_zero_only

    no_launcher.setattr(rank_zero_only, "rank", 1)
    launch.say_failure(2, "a bad option", "error: a bad option", alike=True)
    launch.say_failure(7, "out of memory", "error: out of memory", alike=False)
    assert capsys.readouterr().err == "error: out of memory\n"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    no_launcher.setenv("MASTER_ADDR", "127.0.0.1")
    no_launcher.setenv("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        store = launch.peers_store()
        store.set(launch.FAILED, "2\t1\ta bad option")  # process 1 told it first
        for status, line in ((2, "a bad option"), (7, "out of memory")):
            launch.say_failure(status, line, f"error: {line}", alike=status == 2)
        assert capsys.readouterr().err == "error: out of memory\n"
        assert store.add(launch.READ, 0) == 2  # both read process 1's
        store.delete_key(launch.FAILED)
        launch.say_failure(2, "a bad option", "error: a bad option", alike=True)
        assert capsys.readouterr().err == "error: a bad option\n"
        assert store.get(launch.FAILED).decode() == "2\t0\ta bad option"
    finally:
        dist.destroy_process_group()


PER_NODE_UNSAID = {k: v for k, v in SLURM_JOB.items() if k != "SLURM_NTASKS_PER_NODE"}


@pytest.mark.parametrize("env, refused", [
    ({"SLURM_JOB_NAME": "interactive", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2"}, "separate runs"),
    ({"SLURM_JOB_NAME": "bash", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PTY_PORT": "4"}, None),
    ({"SLURM_JOB_NAME": "bash", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "WORLD_SIZE": "2"}, None),
    (SLURM_JOB, None),
    (PER_NODE_UNSAID, "no tasks per node"),
])
def test_slurm_tasks_that_lightning_would_not_train_as_one_run_are_refused(env, refused, no_launcher):
    """srun's tasks in an interactive job (not those of an `srun --pty bash` shell, where one runs, on a
    terminal; not those a launcher of the user's numbered), and a job's tasks asked for without
    --ntasks-per-node."""
    from vit.exits import ConfigError

    for key in ("SLURM_PTY_PORT", "SLURM_STEP_NUM_TASKS"):
        no_launcher.delenv(key, raising=False)
    no_launcher.setattr(launch.sys, "stdin", type("Terminal", (), {"isatty": lambda self: True})())
    for key, value in env.items():
        no_launcher.setenv(key, value)
    if refused is None:
        launch.check_slurm_tasks()
        return
    with pytest.raises(ConfigError, match=refused):
        launch.check_slurm_tasks()
