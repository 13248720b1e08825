"""Which code a process runs: the commit checked out and its uncommitted changes (``tree``), read once per
process (``this_tree``, ``commit``). A run's record names them (vit.training.results), and so does each command of
a run in its checkpoints (``code``, vit.training.callbacks.TrainingClock)."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# what a record's commit and diff leave out (`tree`): records, and pages that run nothing
NOT_CODE = ("results", "docs", "README.md", "CITATION.cff", "LICENSE")
# of the files git does not track, those that are code (a new module, recipe, plan or script, wherever it is): not
# what commands write into the clone (an export, figures, a CSV, a log, a venv's binaries, a user's images)
UNTRACKED_CODE = ("vit", "scripts", "configs", "experiments",
                  *(f":(glob)**/*.{suffix}" for suffix in ("py", "yaml", "yml", "toml", "sh", "sbatch", "cfg")))


def tree(repo: Path) -> tuple[dict, bytes | None]:
    """The commit checked out in ``repo`` and whether its files differ from it (``dirty``): a tracked file
    changed, or a file of code git does not track and .gitignore does not ignore (``UNTRACKED_CODE``: a new
    module or recipe is code that runs). When they do, the changes: ``git diff --binary HEAD`` of the tracked files and of the untracked ones
    as new files (read through a copy of the index that adds them, the user's own index untouched), after a
    preamble that names the commit; ``git apply`` takes it. None and None outside a git checkout (an installed
    wheel: its version says what ran). Left out of both: results/, which holds records, what measuring writes,
    and the pages (README.md, docs/, the licence and citation), whose tables `make figures` renders from those
    records: neither is code that runs (``NOT_CODE``); and what .gitignore ignores (run folders, data, a job's
    log: slurm-*.out). The state of a dirty tree also has ``changes``: a digest of the diff. Git takes no lock
    on the user's index (GIT_OPTIONAL_LOCKS=0): the user's own git commands at a job's start do not fail on
    this one's index.lock."""
    environment = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}

    def git(*args: str, index: str | None = None) -> bytes | None:  # (bytes: a diff is not always UTF-8)
        env = environment if index is None else {**environment, "GIT_INDEX_FILE": index}
        try:
            out = subprocess.run(["git", "-c", "core.quotePath=true", "-c", "diff.suppressBlankEmpty=false", *args],
                                 cwd=repo, capture_output=True, timeout=30, env=env)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout if out.returncode == 0 else None

    def text(out: bytes | None) -> str | None:
        return None if out is None else out.decode(errors="surrogateescape")

    code = ("--", ".", *(f":!{path}" for path in NOT_CODE))
    if not (repo / ".git").exists() or (sha := text(git("rev-parse", "HEAD"))) is None:
        return {"commit": None, "dirty": None}, None
    sha = sha.strip()
    status = text(git("status", "--porcelain", "--untracked-files=no", *code))
    new = git("ls-files", "-z", "--others", "--exclude-standard", "--", *UNTRACKED_CODE, *code[2:])
    if status is None or new is None:  # (git failed: whether the tree is clean is not known)
        return {"commit": sha, "dirty": None}, None
    new = [name.decode(errors="surrogateescape") for name in new.split(b"\0") if name]
    if not status.strip() and not new:
        return {"commit": sha, "dirty": False}, None
    diff = _diff(repo, git, code, new)
    if diff is None:  # (git failed: the record says dirty, its tables "the diff was not kept")
        return {"commit": sha, "dirty": True}, None
    preamble = [f"The uncommitted changes to {sha} that made the record beside this file: its tracked files' and, as",
                "new files, those it did not track (git diff --binary HEAD); `git apply` it in a checkout of that commit.",
                ""]
    return {"commit": sha, "dirty": True, "changes": hashlib.blake2b(diff, digest_size=8).hexdigest()}, \
        ("\n".join(preamble) + "\n").encode(errors="surrogateescape") + diff


def _diff(repo: Path, git, code: tuple[str, ...], new: list[str]) -> bytes | None:
    """``git diff --binary HEAD`` of ``code``, the untracked files of code (``new``) as new files: through a copy
    of the index in which they are added as intended (``git add -N``), so that the user's index is left as it
    is. None where git fails."""
    where = git("rev-parse", "--git-path", "index")  # (relative to ``repo``, or absolute in a worktree)
    if where is None:
        return None
    with tempfile.TemporaryDirectory(prefix="vit-index-") as folder:
        index = os.path.join(folder, "index")
        try:
            # (its time too: a file changed in the second the index was written is compared by its contents)
            shutil.copy2(repo / where.decode(errors="surrogateescape").strip(), index)
        except FileNotFoundError:  # (a repository without an index yet: the untracked files are all)
            pass
        except OSError:
            return None
        if new and git("add", "--intent-to-add", "--", *new, index=index) is None:
            return None
        # the diff as `git apply` takes it, and the same bytes for the same changes, whatever the user's git
        # configuration (colour, prefixes, external tools, diff algorithm, context, hunks, renames, order,
        # abbreviated hashes, quoted paths; run at the top, its paths are never relative)
        return git("diff", "--binary", "--no-color", "--no-ext-diff", "--no-textconv", "--src-prefix=a/",
                   "--dst-prefix=b/", "--diff-algorithm=myers", "--unified=3", "--inter-hunk-context=0",
                   "--no-renames", "--full-index", f"-O{os.devnull}", "HEAD", *code, index=index)


@functools.cache
def this_tree() -> tuple[dict, bytes | None]:
    return tree(REPO)


def commit() -> dict:
    """This checkout's commit and ``dirty`` (``tree``). Read once, at the first call: the commands call it when
    they start, so that edits made while a run trains do not count."""
    state = this_tree()[0]
    return {"commit": state["commit"], "dirty": state["dirty"]}


# the code of a command that a checkpoint does not tell (written before checkpoints kept it, or not as ``code`` writes)
NOT_KNOWN = {"commit": "not known", "dirty": None, "changes": None}


def code() -> dict:
    """This process's entry in the list of the code each command of a run ran (TrainingClock's ``trees``): its
    commit, ``dirty``, and a digest of its uncommitted changes (``changes``), so that two commands of one commit
    with other changes differ."""
    return {**commit(), "changes": this_tree()[0].get("changes")}


def code_of(entry) -> dict:
    """An entry of that list read back from a checkpoint: as ``code`` wrote it, or else (crafted, edited) NOT_KNOWN."""
    if isinstance(entry, dict) and isinstance(entry.get("commit"), (str, type(None))) \
            and any(entry.get("dirty") is v for v in (True, False, None)) \
            and isinstance(entry.get("changes"), (str, type(None))):
        return {key: entry.get(key) for key in NOT_KNOWN}
    return dict(NOT_KNOWN)
