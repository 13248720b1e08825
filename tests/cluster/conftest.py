"""Fixtures of the multi-process tests (make test-cluster)."""

import shutil
import subprocess

import pytest

from launch import fresh_clone


@pytest.fixture(scope="session")
def slurm():
    """A SLURM cluster to submit to, or the test is skipped with how to get one."""
    if shutil.which("sbatch") is None:
        pytest.skip("no sbatch here: `sudo bash scripts/slurm/local_cluster.sh` installs and starts a one-node "
                    "SLURM cluster on this machine")
    if subprocess.run(["sinfo", "-h"], capture_output=True, timeout=30).returncode != 0:
        pytest.skip("sbatch is here but no SLURM controller answers: `sudo bash scripts/slurm/local_cluster.sh`")


@pytest.fixture(scope="session")
def clone(tmp_path_factory, slurm):
    """One fresh clone for every job: its first job creates its .venv (`make install`), as a user's would."""
    return fresh_clone(tmp_path_factory.mktemp("user") / "vit")
