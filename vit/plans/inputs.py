"""What a plan's runs need before they start, made once on the machine that runs or submits them: a commit's
checkout, CIFAR-10 in the data root, Fashion-MNIST as image folders."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from vit.plans.plan_file import REPO, Plan, PlanFailed, Run


class Inputs:
    """The inputs of a ``Runner``'s runs (it holds ``data_root``, ``runs_root``, ``quick`` and ``dry_run``: name
    each input where it will be, make none)."""

    def tree(self, job: Run) -> Path:
        """Where the job's code is: this checkout, or a clone of the job's commit under RUNS/.checkouts (made in a
        sibling folder and moved into place when complete: a clone that was cut short is never used)."""
        if job.commit is None:
            return REPO
        tree = self.runs_root / ".checkouts" / job.commit[:7]
        if not tree.is_dir():
            if subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{job.commit}^{{commit}}"]).returncode:
                raise PlanFailed(f"{job.table}/{job.name} runs commit {job.commit}, which this clone does not have "
                                 "(a shallow clone? `git fetch --unshallow` brings it)")
            if self.dry_run:
                return tree
            tree.parent.mkdir(parents=True, exist_ok=True)
            part = tree.with_name(f"{tree.name}.part-{os.getpid()}")
            shutil.rmtree(part, ignore_errors=True)
            for command in (["git", "clone", "--quiet", "--shared", "--no-checkout", str(REPO), str(part)],
                            ["git", "-C", str(part), "checkout", "--quiet", "--detach", job.commit]):
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode:
                    shutil.rmtree(part, ignore_errors=True)
                    why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
                    raise PlanFailed(f"{job.table}/{job.name}: could not check out commit {job.commit} into {tree} "
                                     f"({shlex.join(command[:4])}: {why})")
            # its recipes as its package (pyproject's package-dir maps configs/ to vit.configs), so that
            # PYTHONPATH=tree imports its vit and its recipes, never this checkout's (an untracked link, which
            # the clone's git ignores: not a change to the commit's code, vit.training.commits.tree)
            link = part / "vit" / "configs"
            if not link.exists() and not link.is_symlink():
                link.symlink_to(Path("..") / "configs")
            (part / ".git" / "info").mkdir(exist_ok=True)
            with open(part / ".git" / "info" / "exclude", "a") as exclude:
                exclude.write("/vit/configs\n")
            try:
                os.replace(part, tree)
            except OSError:  # another process put the same checkout in place first
                shutil.rmtree(part, ignore_errors=True)
                if not tree.is_dir():
                    raise
        return tree

    @staticmethod
    def pythonpath(tree: Path, rest: str | None = None, shell: bool = False) -> str:
        """PYTHONPATH for a commit's run: its own checkout first (before this checkout's installed package),
        then ``rest``; ``shell``: a bash word that appends the script's own $PYTHONPATH when set."""
        if shell:
            return shlex.quote(str(tree)) + "${PYTHONPATH:+:$PYTHONPATH}"
        return os.pathsep.join(filter(None, [str(tree), rest]))

    def cifar(self, plan: Plan) -> None:
        """CIFAR-10 in the data root before any run starts (runs at once, or a job array's tasks, would each
        fetch it into one folder): downloaded once here when missing; --quick: generated."""
        from vit.data import cifar
        from vit.exits import DatasetError

        if self.dry_run or not any(isinstance(job, Run) and job.data == "cifar" for job in plan.runs):
            return
        if cifar.is_complete(self.data_root / cifar.FOLDER):
            return
        if self.quick:
            make_quick_data(self.data_root)
            return
        print(f"[plan] CIFAR-10 into {self.data_root / cifar.FOLDER}", flush=True)
        try:
            cifar.download(self.data_root)
        except DatasetError as e:
            raise PlanFailed(f"CIFAR-10 is not in {self.data_root} and could not be downloaded here: run `make data` "
                             f"(python -m vit.commands.data --root {self.data_root}) where there is network") from e

    def folders_path(self) -> Path:
        """Where Fashion-MNIST's image folders are (``folders`` makes them)."""
        return self.data_root / "fashion-mnist-folders"

    def folders(self) -> Path:
        """Fashion-MNIST as image folders, DATA_ROOT/fashion-mnist-folders, made once from
        DATA_ROOT/FashionMNIST (torchvision downloads its files there when missing; --quick: generated)."""
        out = self.folders_path()
        if not out.is_dir() and not self.dry_run:
            from vit.exits import DatasetError
            from vit.data.folders import fashion_mnist_folders, write_fake_raw

            if self.quick:
                write_fake_raw(self.data_root)
            print(f"[plan] Fashion-MNIST as image folders: {out}", flush=True)
            try:
                fashion_mnist_folders(self.data_root, out, download=not self.quick)
            except DatasetError as e:
                raise PlanFailed(str(e)) from None
        return out


def make_quick_data(root: Path) -> Path:
    """A small CIFAR-10 in the official format (a learnable task: each class has its colour), for --quick."""
    from vit.data.cifar import write_fake

    return write_fake(root)
