"""README as typed: each ```bash block of README.md runs with `bash -e` in a new shell (a clean environment
whose PATH has no venv), after README's two set-up commands, in a fresh copy of the repository's files with
`.venv` linked in (nothing is written into the checkout).

A block runs as typed, but for its placeholders (CKPT, DIR, HOST), which become files and values made here,
and for the options that make a run small (generated CIFAR-10 in `data/`, where a first run downloads it;
2 optimizer steps; image folders of a few images). A command that cannot run inside a test is listed in
NOT_RUN with its reason; a command that is neither run nor listed fails
`test_every_readme_command_is_run_or_listed` (in make test), so a new command gets a decision.

The blocks' runs take about 4 minutes on 2 cores (each command starts Python and torch): make test-long."""

import re
import shlex
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import ROOT, TEST_LINE, make_fake_cifar, write_images

PAGE = ROOT / "README.md"
SMALL_TRAIN = ["--trainer.max_steps", "2", "--data.batch_size", "8"]  # each added where the command has none
# A new shell: no venv on PATH, no credentials (W&B logs offline, as it does for a user without them).
SHELL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Commands that cannot run inside a test, by how they start (regex on the command, its comment left out).
NOT_RUN = {
    r"make test$": "the test suite itself, which this test is part of",
    r"make test-long$": "the long tests, this one among them",
    r"make test-cluster$": "the multi-process tests (tests/cluster), which need the SLURM cluster CI starts",
    r"sudo bash scripts/slurm/local_cluster\.sh$": "starts SLURM's daemons as root on this machine",
    r"sbatch ": "submits a job that asks a SLURM cluster for GPUs (tests/cluster submits this script to a "
                "one-node cluster)",
    r"torchrun --nnodes 2 ": "waits for the second node (tests/cluster runs torchrun across two nodes on one machine)",
    r"python scripts/train\.py --trainer\.devices 4 ": "needs 4 GPUs (tests/cluster runs DDP on CPU processes)",
    r"python scripts/train\.py --config finetune_cifar10 ": "downloads timm's ImageNet weights from the Hugging "
        "Face Hub (tests/test_train.py runs it with a local weights file)",
    r"make figures$": "measures this machine's whole table, for half an hour or more (tests/test_figures.py runs "
                      "it at toy scale)",
}


@dataclass
class Command:
    line: int   # where it starts in README.md
    code: str   # as typed, continuation lines joined, without its comment
    argv: list[str]


def split_comment(text: str) -> str:
    """The command without its trailing comment (a # outside quotes, at a word's start)."""
    quote = None
    for i, char in enumerate(text):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].rstrip()
    return text.rstrip()


def blocks(page: Path = PAGE) -> list[tuple[int, list[Command]]]:
    """Each ```bash block of the page: the line it starts on, and its commands."""
    text = page.read_text()
    found = []
    for match in re.finditer(r"^```bash\n(.*?)^```", text, re.S | re.M):
        first = text[: match.start()].count("\n") + 2
        commands, pending, start = [], "", first
        for number, raw in enumerate(match.group(1).splitlines(), first):
            if not pending:
                start = number
            if raw.rstrip().endswith("\\"):
                pending += raw.rstrip()[:-1] + " "
                continue
            code = " ".join(split_comment(pending + raw).split())
            pending = ""
            if code:
                commands.append(Command(start, code, shlex.split(code)))
        found.append((first, commands))
    return found


BLOCKS = blocks()


def not_run(command: Command) -> str | None:
    return next((why for pattern, why in NOT_RUN.items() if re.match(pattern, command.code)), None)


def without_env(argv: list[str]) -> list[str]:
    """The command's words after its leading VAR=value assignments."""
    while argv and re.match(r"[A-Za-z_][A-Za-z0-9_]*=", argv[0]):
        argv = argv[1:]
    return argv


def small_train(argv: list[str]) -> list[str]:
    return [word for name, value in zip(SMALL_TRAIN[::2], SMALL_TRAIN[1::2])
            if name not in argv for word in (name, value)]


def rewrite(command: Command, values: dict[str, str]) -> tuple[str, str] | None:
    """(the line bash runs, what the test then checks) for a command the test runs, or None for one it does not
    know. ``values``: the placeholders' values and the demo's port."""
    code = re.sub(r"\b(CKPT|DIR|HOST)\b", lambda m: values[m.group(1)], command.code)
    argv = without_env(command.argv)
    words = " ".join(argv[:2])
    if command.code == "source .venv/bin/activate" or argv[:2] == ["rm", "-rf"]:
        return code, ""
    if words in ("python scripts/train.py", "vit-train") or argv[:1] == ["vit-train"]:
        check = "help" if "--help" in argv else "train"
        return " ".join([code, *map(shlex.quote, small_train(argv))]), check
    if argv[:2] == ["make", "train"] and not any(word.startswith("ARGS=") for word in argv):
        return f"{code} ARGS={shlex.quote(' '.join(small_train(argv)))}", "train"
    tool = re.fullmatch(r"python scripts/(\w+)\.py|(vit-\w+)", words if words.startswith("python") else argv[0])
    name = tool and (tool.group(1) or tool.group(2).removeprefix("vit-"))
    if name in ("classify", "rollout", "export"):
        return code, name
    if name == "demo":  # a server that runs until stopped: until its page answers, on a free port
        return f"page_answers {values['PORT']} {code} --port {values['PORT']}", name
    if command.code == "make figures ARGS=--check":
        return code, ""
    return None


PAGE_ANSWERS = r"""
page_answers() {  # PORT COMMAND...: runs the server COMMAND until http://127.0.0.1:PORT/ answers 200, then stops it
  local port=$1; shift
  "$@" & local server=$!
  for _ in $(seq 300); do
    if ! kill -0 "$server" 2>/dev/null; then wait "$server"; echo "the server ended before its page answered" >&2; return 1; fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$port" && printf 'GET / HTTP/1.0\r\n\r\n' >&3 && head -1 <&3 | grep -q ' 200') 2>/dev/null
    then echo "page answered: http://127.0.0.1:$port/"; kill "$server"; wait "$server" || true; return 0; fi
    sleep 1
  done
  kill "$server"; echo "no page at http://127.0.0.1:$port/ within 300 s" >&2; return 1
}
"""


def script(commands: list[Command], values: dict[str, str]) -> tuple[str, list[str]]:
    """The block as bash runs it, and what to check after it."""
    lines, checks = [PAGE_ANSWERS], []
    for command in commands:
        why = not_run(command)
        if why:
            lines.append(f"# not run here: {command.code}  ({why})")
            continue
        done = rewrite(command, values)
        assert done, f"README.md:{command.line}: {command.code}"
        lines.append(done[0])
        checks.append(done[1])
    return "\n".join(lines) + "\n", [c for c in checks if c]


def test_every_readme_command_is_run_or_listed():
    """A new command in README gets a decision: run here (a rule in ``rewrite``), or listed in NOT_RUN."""
    values = {"CKPT": "c.ckpt", "DIR": "d", "HOST": "127.0.0.1", "PORT": "1"}
    commands = [c for _, found in BLOCKS for c in found]
    unknown = [f"README.md:{c.line}: {c.code}" for c in commands if not not_run(c) and not rewrite(c, values)]
    assert len(BLOCKS) >= 5 and len(commands) >= 15
    assert not unknown, "neither run nor listed in tests/test_readme.py:\n" + "\n".join(unknown)
    stale = [p for p in NOT_RUN if not any(re.match(p, c.code) for c in commands)]
    assert not stale, f"NOT_RUN lists commands README no longer has: {stale}"
    assert any(c.code == "source .venv/bin/activate" for c in commands)


def test_blocks_that_need_the_environment_begin_with_it():
    """Each block that runs Python or the environment's commands activates .venv before them."""
    for first, commands in BLOCKS:
        words = [without_env(c.argv)[0] for c in commands]
        needs = [i for i, w in enumerate(words) if w in ("python", "torchrun", "wandb") or w.startswith("vit-")]
        assert not needs or commands[0].code == "source .venv/bin/activate", f"README.md:{first}: {commands[0].code}"


def fresh_copy(dest: Path) -> Path:
    """The repository's files (tracked, and untracked but not ignored) as a new clone has them, .venv linked."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name, follow_symlinks=False)  # modification times kept: make sees .venv up to date
    (dest / ".venv").symlink_to(ROOT / ".venv")
    return dest


def new_shell(home: Path) -> dict[str, str]:
    return {"PATH": SHELL_PATH, "HOME": str(home), "LANG": "C.UTF-8"}


@dataclass
class SetUp:
    cwd: Path       # the clone after README's set-up commands
    values: dict
    home: Path
    proc: subprocess.CompletedProcess
    script: str
    checks: list


def run_block(commands: list[Command], cwd: Path, values: dict, home: Path):
    text, checks = script(commands, values)
    path = cwd.parent / f"{cwd.name}.sh"
    path.write_text(text)
    proc = subprocess.run(["bash", "-e", str(path)], cwd=cwd, env=new_shell(home), capture_output=True, text=True,
                          timeout=900)
    return proc, text, checks


SET_UP = next(i for i, (_, commands) in enumerate(BLOCKS) if any(c.argv[:2] == ["make", "train"] for c in commands))


@pytest.fixture(scope="module")
def set_up(tmp_path_factory) -> SetUp:
    """README's two set-up commands in a fresh clone, with a user's files: CIFAR-10 (generated) where the first
    run downloads it, cat.jpg, photos/, and image folders (DIR)."""
    if not (ROOT / ".venv" / "bin" / "activate").is_file() or shutil.which("git") is None:
        pytest.skip("needs the checkout's .venv (README's set-up commands make it) and git")
    base = tmp_path_factory.mktemp("readme")
    cwd = fresh_copy(base / "set-up")
    if subprocess.run(["make", "-q", "install"], cwd=cwd).returncode:
        pytest.fail(f"{ROOT / '.venv'} is not installed for this checkout: `make install` first")
    make_fake_cifar(cwd / "data", per_batch=50, test_size=100)
    write_images(cwd / "photos", 3, (200, 20, 20))
    shutil.copy(cwd / "photos" / "1.jpg", cwd / "cat.jpg")
    folders = base / "folders"
    for name, colour in (("red", (200, 20, 20)), ("blue", (20, 20, 200))):
        write_images(folders / "train" / name, 10, colour)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    values = {"CKPT": "runs/cpu/version_0/checkpoints/last.ckpt", "DIR": str(folders), "HOST": "127.0.0.1",
              "PORT": str(port)}
    (home := base / "home").mkdir()
    proc, text, checks = run_block(BLOCKS[SET_UP][1], cwd, values, home)
    return SetUp(cwd, values, home, proc, text, checks)


def check(kind: str, cwd: Path, out: str) -> None:
    if kind == "train":
        assert re.search(TEST_LINE, out)
    elif kind == "help":
        assert "--model.arch.dim" in out
    elif kind == "classify":
        assert re.search(r"cat\.jpg.*\b(airplane|automobile|bird|cat|deer|dog|frog|horse|ship|truck)\b", out)
    elif kind == "rollout":
        assert any((cwd / "figures").iterdir())
    elif kind == "export":
        assert (cwd / "vit-cifar" / "config.json").is_file()
    elif kind == "demo":
        assert "page answered: http://127.0.0.1:" in out
    else:
        raise AssertionError(kind)


@pytest.mark.long
@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"README.md:{first}" for first, _ in BLOCKS])
def test_readme_block_runs_as_typed(index, set_up, tmp_path):
    if index == SET_UP:
        cwd, (proc, text, checks) = set_up.cwd, (set_up.proc, set_up.script, set_up.checks)
    else:
        cwd = fresh_copy(tmp_path / "clone")
        for kept in ("runs", "data", "photos", "cat.jpg"):  # what the user has after the set-up commands
            source = set_up.cwd / kept
            if source.is_dir():
                shutil.copytree(source, cwd / kept, dirs_exist_ok=True)
            else:
                shutil.copy2(source, cwd / kept)
        proc, text, checks = run_block(BLOCKS[index][1], cwd, set_up.values, set_up.home)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{text}\n--- exit {proc.returncode}:\n{out[-4000:]}"
    assert "Traceback" not in out, out[-4000:]
    for kind in checks:
        check(kind, cwd, out)
    assert len(re.findall(TEST_LINE, out)) == checks.count("train"), out[-4000:]  # each run trained and tested
