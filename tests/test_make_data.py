"""`make data` (python -m vit.commands.data): CIFAR-10 fetched, its md5 checked and every file read back, on a
login node before jobs run where there is no network. Here the archive is a generated one, served on
127.0.0.1 by an HTTP server of the test's own: never the real host."""

import functools
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import hashlib
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from helpers import make_fake_cifar

ROOT = Path(__file__).resolve().parents[1]


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # (the server's lines would mix with the command's stderr in this process)
        pass


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):  # a download given up mid-way breaks the pipe: no matter
        pass


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> tuple[str, str]:
    """The URL of a cifar-10-python.tar.gz laid out as the official one (cifar-10-batches-py/ inside), and
    its md5."""
    tmp = tmp_path_factory.mktemp("mirror")
    data = make_fake_cifar(tmp / "src", per_batch=20, test_size=30)
    path = tmp / "cifar-10-python.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(data / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    handler = functools.partial(QuietHandler, directory=str(tmp))
    server = QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/{path.name}", hashlib.md5(path.read_bytes()).hexdigest()
    server.shutdown()
    server.server_close()


def fetch(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vit.commands.data", "--root", str(root), *args],
                          cwd=root.parent, capture_output=True, text=True, timeout=120)


def test_make_data_runs_the_command_it_documents():
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}  # (under make test)
    dry = subprocess.run(["make", "-n", "data", "ARGS=--root DIR"], cwd=ROOT, capture_output=True, text=True, env=env)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[-1].endswith("/bin/python -m vit.commands.data --root DIR")


def here(capsys, root: Path, *args: str) -> tuple[int, str, str]:
    """The command's main() in this process (no torch import to wait for): status, stdout, stderr."""
    from vit.commands.data import main

    status = main(["--root", str(root), *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_fetches_checks_and_reads_back_then_only_reads(archive, tmp_path, capsys):
    url, md5 = archive
    root = tmp_path / "data"
    first = fetch(root, "--url", url, "--md5", md5)
    assert first.returncode == 0, first.stderr[-2000:]
    folder = root / "cifar-10-batches-py"
    assert first.stdout.strip() == (f"{folder}: downloaded from {url} (md5 {md5} checked); "
                                    "100 training and 30 test images of 10 classes read back")
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["batches.meta", "test_batch", *(f"data_batch_{i}" for i in range(1, 6))])
    status, out, err = here(capsys, root, "--url", url.replace("cifar-10-python", "missing"))  # no fetch at all
    assert status == 0, err
    assert out.strip() == f"{folder}: already there; 100 training and 30 test images of 10 classes read back"


def test_a_corrupt_download_a_dead_url_and_a_malformed_file_are_one_line_each(archive, tmp_path, capsys):
    url, md5 = archive
    wrong = here(capsys, tmp_path / "a", "--url", url, "--md5", "0" * 32)  # not the archive it should be
    dead = here(capsys, tmp_path / "b", "--url", url.replace("cifar-10-python", "missing"))  # 404
    for status, out, err in (wrong, dead):
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert status == 2 and out == "" and len(errors) == 1 and "Traceback" not in err, err
        assert errors[0].startswith(f"error: CIFAR-10 is not in {tmp_path}") and "127.0.0.1" in errors[0]
    assert "File not found or corrupted" in wrong[2] and "404" in dead[2]
    root = tmp_path / "c"
    assert here(capsys, root, "--url", url, "--md5", md5)[0] == 0
    (root / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"not a pickle")
    status, out, err = here(capsys, root)
    assert status == 2 and err.count("\n") == 1
    assert err.startswith(f"error: {root / 'cifar-10-batches-py' / 'data_batch_3'}: not a valid CIFAR batch")
