"""README as typed: each ```bash block of README.md and docs/*.md runs with `bash -e` in a new shell (a clean
environment whose PATH has no venv), after README's two set-up commands, in a fresh copy of the repository's
files with `.venv` linked in (nothing is written into the checkout).

A block runs as typed, but for its placeholders (CKPT, DIR, HOST), which become files and values made here,
and for the options that make a run small (generated CIFAR-10 in `data/`, where a first run downloads it;
2 optimizer steps of 8 images). The user's own files are generated: cat.jpg, photos/, image folders (DIR),
and an exported model folder (exported/). A command that cannot run inside a test is listed in NOT_RUN with
its reason; a command that is neither run nor listed fails `test_every_command_is_run_or_listed` (in make
test), so a new command gets a decision.

The blocks' runs take about 7 minutes on 2 cores (each command starts Python and torch): make test-long."""

import re
import shlex
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import ROOT, TEST_LINE, make_fake_cifar, run_here, write_images

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ACTIVATE = "source .venv/bin/activate"
SMALL_TRAIN = ["--trainer.max_steps", "2", "--data.batch_size", "8"]  # each added where the command has none
# A new shell: no venv on PATH, no credentials (W&B logs offline, as it does for a user without them).
SHELL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Commands that cannot run inside a test, by how they start (regex on the command, its comment left out).
NOT_RUN = {
    r"make test$": "the test suite itself, which this test is part of",
    r"make test-long$": "the long tests, this one among them",
    r"make test-cluster$": "the multi-process tests (tests/cluster), which need the SLURM cluster CI starts",
    r"make test-lowest$": "installs every dependency at its lowest allowed version into a venv of its own, then "
                          "runs tests (CI runs it)",
    r"make data$": "downloads CIFAR-10 from its host (tests/test_make_data.py fetches a generated archive from a "
                   "server on 127.0.0.1)",
    r"sudo bash scripts/slurm/local_cluster\.sh$": "starts SLURM's daemons as root on this machine",
    r"sbatch ": "submits a job that asks a SLURM cluster for GPUs (tests/cluster submits this script to a "
                "one-node cluster)",
    r"torchrun --nnodes 2 ": "waits for the second node (tests/cluster runs torchrun across two nodes on one machine)",
    r"python scripts/train\.py .*--trainer\.devices [48] ": "needs 4 or 8 GPUs (tests/cluster runs DDP on CPU "
                                                            "processes)",
    r"python scripts/train\.py --config finetune_cifar10 ": "fine-tunes ViT-S/16 at 224 px from timm's ImageNet "
        "weights, which it downloads (tests/test_train.py runs the offline form with a small timm model)",
    r"python scripts/train\.py --config vit_cifar10_fast ": "torch.compile's GPU recipe (tests/test_compile.py "
                                                            "compiles it on CPU, in make test-long)",
    r"python scripts/export\.py .*--push-to-hub ": "uploads to the Hugging Face Hub (tests/test_hub.py uploads to a "
                                                   "stand-in)",
    r"make figures$": "measures this machine's whole table, for half an hour or more (tests/test_figures.py runs "
                      "it at toy scale)",
    r"make figures ARGS=\"--plan ": "an experiment of docs/results.md: hours of training",
    r"python scripts/plan\.py run ": "trains the plan's 9 runs of the cpu recipe, 10 minutes each (tests/test_plans.py "
                                     "runs a plan of 2 changes × 2 seeds at toy scale)",
    r"python scripts/plan\.py submit (?!.*--dry-run)": "submits a job array to a SLURM cluster (tests/cluster/"
                                                      "test_plan_slurm.py submits a two-run plan to a one-node cluster)",
    r"make (install|wheels)\b": "installs or downloads packages (tests/test_install.py installs from a wheel folder)",
    r"wandb (login|sweep|agent)\b": "needs a W&B account and its server (tests/test_sweeps.py builds the runs' "
                                   "commands with the agent's own code, and runs one)",
}


@dataclass
class Command:
    line: int   # where it starts on its page
    code: str   # as typed, continuation lines joined, without its comment
    argv: list[str]


@dataclass
class Block:
    page: Path
    line: int
    commands: list[Command]

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


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


def blocks(page: Path) -> list[Block]:
    """Each ```bash block of the page (indented ones in lists too): the line it starts on, and its commands."""
    text = page.read_text()
    found = []
    for match in re.finditer(r"^([ \t]*)```bash\n(.*?)^\1```", text, re.S | re.M):
        first = text[: match.start()].count("\n") + 2
        commands, pending, start = [], "", first
        for number, raw in enumerate(match.group(2).splitlines(), first):
            raw = raw.removeprefix(match.group(1)).rstrip()
            if not pending:
                start = number
            if raw.endswith("\\"):
                pending += raw[:-1] + " "
                continue
            code = " ".join(split_comment(pending + raw).split())
            pending = ""
            if code:
                commands.append(Command(start, code, shlex.split(code)))
        found.append(Block(page, first, commands))
    return found


BLOCKS = [block for page in PAGES for block in blocks(page)]


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


def program(argv: list[str]) -> str | None:
    """classify, train, ...: the project's command that ``argv`` runs (its script or its console script)."""
    match = re.fullmatch(r"python scripts/(\w+)\.py|vit-(\w+)", " ".join(argv[:2]) if argv[:1] == ["python"]
                         else " ".join(argv[:1]))
    return match and (match.group(1) or match.group(2))


def rewrite(command: Command, values: dict[str, str]) -> tuple[str, str] | None:
    """(the line bash runs, what the test then checks) for a command the test runs, or None for one it does not
    know. ``values``: the placeholders' values and the demo's port."""
    code = re.sub(r"\b(CKPT|DIR|HOST)\b", lambda m: values[m.group(1)], command.code)
    argv = without_env(command.argv)
    name = program(argv)
    if command.code == ACTIVATE or argv[:2] == ["rm", "-rf"]:
        return code, ""
    if re.fullmatch(r"make figures ARGS=(--check|--render|--help)", command.code):
        return code, ""
    if name == "plan" and (argv[2:3] in (["show"], ["table"]) or "--dry-run" in argv):  # reads, or writes a script
        return code, ""
    if name == "train":
        mode = argv[2:3] if argv[0] == "python" else argv[1:2]
        check = "help" if "--help" in argv else "test" if mode == ["test"] else "train"
        return " ".join([code, *map(shlex.quote, small_train(argv))]), check
    if argv[:2] == ["make", "train"]:  # the small options join the command's own ARGS
        words = shlex.split(code)
        given = next((word.removeprefix("ARGS=") for word in words if word.startswith("ARGS=")), "")
        small = " ".join([given, *map(shlex.quote, small_train(shlex.split(given)))]).strip()
        return shlex.join([*(w for w in words if not w.startswith("ARGS=")), f"ARGS={small}"]), "train"
    if name in ("classify", "rollout", "export"):  # what each writes: its --output, or lines (classify), figures
        return code, "file " + argv[argv.index("--output") + 1] if "--output" in argv else name
    if name == "demo":  # a server that runs until stopped: until its page answers, on a free port
        return f"page_answers {values['PORT']} {code} --port {values['PORT']}", name
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


def script(block: Block, values: dict[str, str]) -> tuple[str, list[str]]:
    """The block as bash runs it, and what to check after it."""
    lines, checks = [PAGE_ANSWERS], []
    for command in block.commands:
        why = not_run(command)
        if why:
            lines.append(f"# not run here: {command.code}  ({why})")
            continue
        done = rewrite(command, values)
        assert done, f"{block.page.name}:{command.line}: neither run nor listed: {command.code}"
        lines.append(done[0])
        checks.append(done[1])
    return "\n".join(lines) + "\n", [c for c in checks if c]


def test_every_command_is_run_or_listed():
    """A new command in README or docs/ gets a decision: run here (a rule in ``rewrite``), or listed in NOT_RUN."""
    values = {"CKPT": "c.ckpt", "DIR": "d", "HOST": "127.0.0.1", "PORT": "1"}
    commands = [(b, c) for b in BLOCKS for c in b.commands]
    unknown = [f"{b.page.name}:{c.line}: {c.code}" for b, c in commands if not not_run(c) and not rewrite(c, values)]
    assert sum(b.page.name == "README.md" for b in BLOCKS) >= 5 and len(commands) >= 40
    assert not unknown, "neither run nor listed in tests/test_readme.py:\n" + "\n".join(unknown)
    stale = [p for p in NOT_RUN if not any(re.match(p, c.code) for _, c in commands)]
    assert not stale, f"NOT_RUN lists commands no page has any more: {stale}"


def test_blocks_that_need_the_environment_begin_with_it():
    """Each block that runs Python, pip or the environment's commands activates .venv before them."""
    for block in BLOCKS:
        words = [without_env(c.argv)[0] for c in block.commands]
        needs = any(w in ("python", "pip", "torchrun", "wandb") or w.startswith("vit-") for w in words)
        assert not needs or block.commands[0].code == ACTIVATE, f"{block.name}: {block.commands[0].code}"


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


@dataclass
class SetUp:
    cwd: Path       # the clone after README's set-up commands, with the user's files
    values: dict
    home: Path
    proc: subprocess.CompletedProcess
    script: str
    checks: list


USER_FILES = ("runs", "data", "photos", "cat.jpg", "exported")  # what a block's clone has from the set-up


def run_block(block: Block, cwd: Path, values: dict, home: Path):
    text, checks = script(block, values)
    path = cwd.parent / f"{cwd.name}.sh"
    path.write_text(text)
    proc = subprocess.run(["bash", "-e", str(path)], cwd=cwd, env={"PATH": SHELL_PATH, "HOME": str(home),
                          "LANG": "C.UTF-8"}, capture_output=True, text=True, timeout=900)
    return proc, text, checks


SET_UP = next(b for b in BLOCKS if b.page.name == "README.md" and any(c.argv[:2] == ["make", "train"] for c in b.commands))


@pytest.fixture(scope="module")
def set_up(tmp_path_factory) -> SetUp:
    """README's two set-up commands in a fresh clone, with a user's files: CIFAR-10 (generated) where the first
    run downloads it, cat.jpg, photos/, image folders (DIR), and the trained model exported (exported/)."""
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
    proc, text, checks = run_block(SET_UP, cwd, values, home)
    if proc.returncode == 0:
        exported = run_here("export.py", "--checkpoint", cwd / values["CKPT"], "--output", cwd / "exported",
                            "--format", "timm")
        assert exported.returncode == 0, exported.stderr
    return SetUp(cwd, values, home, proc, text, checks)


def check(kind: str, cwd: Path, out: str) -> None:
    if kind in ("train", "test"):
        assert re.search(TEST_LINE, out)
    elif kind == "help":
        assert "--model.arch.dim" in out
    elif kind == "classify":
        assert re.search(r"cat\.jpg.*\b(airplane|automobile|bird|cat|deer|dog|frog|horse|ship|truck)\b", out)
    elif kind == "rollout":
        assert any((cwd / "figures").iterdir())
    elif kind.startswith("file "):
        assert (cwd / kind.removeprefix("file ")).exists(), kind
    elif kind == "demo":
        assert "page answered: http://127.0.0.1:" in out
    else:
        raise AssertionError(kind)


@pytest.mark.long
@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_block_runs_as_typed(block, set_up, tmp_path):
    if block is SET_UP:
        cwd, (proc, text, checks) = set_up.cwd, (set_up.proc, set_up.script, set_up.checks)
    else:
        assert set_up.proc.returncode == 0, "README's set-up commands failed"
        cwd = fresh_copy(tmp_path / "clone")
        for kept in USER_FILES:
            source = set_up.cwd / kept
            if source.is_dir():
                shutil.copytree(source, cwd / kept, dirs_exist_ok=True)
            else:
                shutil.copy2(source, cwd / kept)
        proc, text, checks = run_block(block, cwd, set_up.values, set_up.home)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{text}\n--- exit {proc.returncode}:\n{out[-4000:]}"
    assert "Traceback" not in out, out[-4000:]
    for kind in checks:
        check(kind, cwd, out)
    # each run trained (or evaluated) and tested
    assert len(re.findall(TEST_LINE, out)) == checks.count("train") + checks.count("test"), out[-4000:]
