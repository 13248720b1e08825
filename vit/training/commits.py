"""Which code a process runs: the commit checked out and its uncommitted changes, read once per process.
Records and checkpoints name them."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# left out of a record's commit and diff: records and pages, not code that runs
NOT_CODE = ("results", "docs", "README.md", "CITATION.cff", "LICENSE")
# untracked files that count as code (not the outputs commands write into the clone)
UNTRACKED_CODE = ("vit", "scripts", "configs", "experiments",
                  *(f":(glob)**/*.{suffix}" for suffix in ("py", "yaml", "yml", "toml", "sh", "sbatch", "cfg")))


def tree(repo: Path) -> tuple[dict, bytes | None]:
    """The commit checked out in ``repo``, whether it is ``dirty``, and if so a digest (``changes``) and a patch.

    Dirty: a tracked file changed, or an unignored untracked file of code exists (UNTRACKED_CODE). NOT_CODE is
    left out. Outside a git checkout (an installed wheel) commit and dirty are None. No optional git locks: the
    user's own git commands at a job's start must not fail on our index.lock."""
    environment = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}

    def git(*args: str, index: str | None = None) -> bytes | None:  # bytes: a diff need not be UTF-8
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
    if status is None or new is None:  # git failed: clean or not is unknown
        return {"commit": sha, "dirty": None}, None
    new = [name.decode(errors="surrogateescape") for name in new.split(b"\0") if name]
    if not status.strip() and not new:
        return {"commit": sha, "dirty": False}, None
    diff = _diff(repo, git, code, new)
    if diff is None:  # git failed: dirty, but no diff kept
        return {"commit": sha, "dirty": True}, None
    preamble = [f"The uncommitted changes to {sha} that made the record beside this file: its tracked files' and, as",
                "new files, those it did not track (git diff --binary HEAD); `git apply` it in a checkout of that commit.",
                ""]
    return {"commit": sha, "dirty": True, "changes": hashlib.blake2b(diff, digest_size=8).hexdigest()}, \
        ("\n".join(preamble) + "\n").encode(errors="surrogateescape") + diff


def _diff(repo: Path, git, code: tuple[str, ...], new: list[str]) -> bytes | None:
    """``git diff --binary HEAD`` of ``code``, with ``new`` as new files (``git add -N`` on a copy of the index,
    leaving the user's index alone). None where git fails."""
    where = git("rev-parse", "--git-path", "index")  # relative to repo, or absolute in a worktree
    if where is None:
        return None
    with tempfile.TemporaryDirectory(prefix="vit-index-") as folder:
        index = os.path.join(folder, "index")
        try:
            # copy2 keeps the mtime, on which git's check of files changed in the index's second relies
            shutil.copy2(repo / where.decode(errors="surrogateescape").strip(), index)
        except FileNotFoundError:  # no index yet
            pass
        except OSError:
            return None
        if new and git("add", "--intent-to-add", "--", *new, index=index) is None:
            return None
        # options pinned: a patch `git apply` takes, the same bytes for the same changes whatever the user's config
        return git("diff", "--binary", "--no-color", "--no-ext-diff", "--no-textconv", "--src-prefix=a/",
                   "--dst-prefix=b/", "--diff-algorithm=myers", "--unified=3", "--inter-hunk-context=0",
                   "--no-renames", "--full-index", f"-O{os.devnull}", "HEAD", *code, index=index)


@functools.cache
def this_tree() -> tuple[dict, bytes | None]:
    return tree(REPO)


def commit() -> dict:
    """This checkout's commit and ``dirty``, read once at start so that edits made during training do not count."""
    state = this_tree()[0]
    return {"commit": state["commit"], "dirty": state["dirty"]}


# a command's code that its checkpoint does not tell (older checkpoint, or a malformed entry)
NOT_KNOWN = {"commit": "not known", "dirty": None, "changes": None}


def code() -> dict:
    """This command's entry in a checkpoint's list of the code each command ran: commit, dirty, ``changes``."""
    return {**commit(), "changes": this_tree()[0].get("changes")}


def code_of(entry) -> dict:
    """An entry of that list read back from a checkpoint, or NOT_KNOWN if not as ``code`` writes it."""
    if isinstance(entry, dict) and isinstance(entry.get("commit"), (str, type(None))) \
            and any(entry.get("dirty") is v for v in (True, False, None)) \
            and isinstance(entry.get("changes"), (str, type(None))):
        return {key: entry.get(key) for key in NOT_KNOWN}
    return dict(NOT_KNOWN)
