"""GPUs on a cluster (vit.cluster.gpus): GPUs allocated that torch cannot use stop the run with one line (exit 2),
and NCCL's timeouts reach the main thread."""

import os

import pytest
import torch

from helpers import errors_of, train_here


QUIET = ["--trainer.logger", "false", "--test_after_fit", "false"]


def test_nccl_errors_reach_the_main_thread_unless_the_user_chose(monkeypatch):
    from vit.cluster.gpus import nccl_errors_reach_python

    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    nccl_errors_reach_python()
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    nccl_errors_reach_python()
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch can use this machine's GPUs")
@pytest.mark.parametrize("variable, value", [("CUDA_VISIBLE_DEVICES", "0,1"), ("SLURM_JOB_GPUS", "3")])
def test_gpus_torch_cannot_use_stop_the_run_instead_of_training_on_the_cpu(tmp_path, fake_cifar_session, capsys,
                                                                          monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    for args in (["--trainer.accelerator", "auto"], None):  # a GPU recipe; and no recipe (the CPU fallback)
        if args is None:
            from vit.commands.train import main

            monkeypatch.chdir(tmp_path)
            code = main(["--data.root", str(fake_cifar_session)])
        else:
            code = train_here(tmp_path, fake_cifar_session, *args, *QUIET)
        (error,) = errors_of(capsys)
        built = f"is built for CUDA {torch.version.cuda}" if torch.version.cuda else "is a CPU-only build"
        assert code == 2 and error.startswith(f"error: this job was given GPUs ({variable}={value}) but torch cannot "
                                              f"use them: torch {torch.__version__} {built}, and "), error
        assert "--trainer.accelerator cpu" in error
    monkeypatch.delenv(variable)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.ckpt"))
