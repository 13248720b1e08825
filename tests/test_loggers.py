"""W&B as a cluster meets it (vit.training.loggers, vit.cluster.network): without credentials, or without a route to the W&B
server (a compute node, a proxy in the way), a run logs offline with one line saying why, after a short wait
at most; the credentials and the server are found as wandb finds them."""

import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import ROOT, TESTS


@pytest.mark.long
def test_wandb_credentials_without_a_route_out_train_offline_after_a_short_wait(tmp_path, fake_cifar_session):
    """WANDB_API_KEY set, and a W&B server that accepts the connection and never answers (a firewall that
    drops, a proxy that hangs): after the probe's 10 s the run trains and tests as usual, logging offline
    into its folder, with one line that says why and how to upload. As a user runs it: bar, W&B on. The
    server counts the seconds the run kept a connection to it open, which is its wait for W&B: the probe's
    10 s and, at its exit, wandb's own check of its analytics endpoint (10 s), not wandb's wait of minutes
    (the run's own time is its machine's, and not bounded here)."""
    with SilentServer() as silent:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]),  # (this tree's vit)
               "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1",
               "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
               "WANDB_BASE_URL": f"http://127.0.0.1:{silent.port}"}
        env.pop("WANDB_MODE", None)
        start = time.monotonic()
        proc = subprocess.run([sys.executable, str(ROOT / "scripts/train.py"), "--config", "smoke", "--data.root",
                               str(fake_cifar_session), "--data.val_size", "100", "--data.num_workers", "0",
                               "--data.batch_size", "50", "--trainer.max_epochs", "1"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        seconds = time.monotonic() - start
    out = proc.stdout + proc.stderr
    waits = [(round(begin - start, 1), round(end - start, 1), request, still_open)
             for begin, end, request, still_open in silent.connections]
    print(f"run with an unreachable W&B: {seconds:.1f} s, {silent.open_seconds():.1f} s of them waiting on it: {waits}")
    assert proc.returncode == 0, out[-3000:]
    run = tmp_path / "runs/smoke/version_0"
    line = (f"wandb: {env['WANDB_BASE_URL']} did not answer within 10 s; logging offline into {run.relative_to(tmp_path)}"
            f"/wandb; upload later with `vit-sync {run.relative_to(tmp_path)}` on a machine with network")
    assert out.count(line) == 1, out[-3000:]
    assert len(list((run / "wandb").glob("offline-run-*"))) == 1 and (run / "results.json").is_file()
    assert "Traceback" not in out
    # the probe asked once; no connection outlived the run, none retried again and again, none for minutes
    assert [request for _, _, request, _ in waits].count("POST /graphql") == 1, waits
    assert not any(still_open for *_, still_open in waits) and len(waits) <= 4 and silent.open_seconds() < 60, waits


class SilentServer:
    """A TCP server on 127.0.0.1 that accepts every connection, reads what comes and never answers;
    ``connections``: each one's start and end (time.monotonic()), its request's first words and whether it was
    still open 10 s after the ``with`` block ended (the server then closes it: a client that outlived the run)."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.connections: list[tuple[float, float, str, bool]] = []
        self.open: dict[socket.socket, threading.Thread] = {}
        self.forced: set[socket.socket] = set()
        self.lock, self.done = threading.Lock(), threading.Event()
        self.acceptor = threading.Thread(target=self.accept, daemon=True)

    def __enter__(self):
        self.acceptor.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.acceptor.join()  # (accepts nothing more)
        self.listener.close()
        with self.lock:
            left = dict(self.open)
        for connection, thread in left.items():
            thread.join(10)  # (a client that ended: its reader sees the end)
            if thread.is_alive():
                self.forced.add(connection)
                connection.shutdown(socket.SHUT_RDWR)  # its reader ends, and records it as still open
                thread.join()

    def accept(self) -> None:
        while not self.done.is_set():
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self.hold, args=(connection, time.monotonic()), daemon=True)
            with self.lock:
                self.open[connection] = thread
            thread.start()

    def hold(self, connection: socket.socket, start: float) -> None:
        received = b""
        with connection:
            connection.settimeout(None)
            try:
                while chunk := connection.recv(65536):
                    received = (received + chunk)[:1024]
            except OSError:  # reset by the client: its end too
                pass
            with self.lock:
                del self.open[connection]
            request = " ".join(received.split(b"\r\n")[0].decode(errors="replace").split()[:2])
            self.connections.append((start, time.monotonic(), request, connection in self.forced))

    def open_seconds(self) -> float:
        """The seconds during which at least one connection was open."""
        total, reached = 0.0, float("-inf")
        for begin, end, *_ in sorted(self.connections):
            total += max(0.0, end - max(begin, reached))
            reached = max(reached, end)
        return total


class Answer(http.server.BaseHTTPRequestHandler):
    """Answers every request with the server's ``status`` and ``body`` (a W&B server, or a proxy in the way)."""

    def answer(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/json" if self.server.body.startswith(b"{") else "text/html")
        self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)

    do_GET = do_POST = do_CONNECT = answer

    def log_message(self, *args):
        pass


@pytest.fixture
def local_server():
    """An HTTP server on 127.0.0.1 (loopback only), answering what the test sets; stopped after the test."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    server.status, server.body, server.timeout = 200, b"", 5
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    thread.join(5)


@pytest.fixture
def no_proxy(monkeypatch):
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "no_proxy",
                 "NO_PROXY", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)


WANDB_LIKE = [(200, b'{"data": {"__typename": "Query"}}'), (401, b'{"errors": [{"message": "unauthorized"}]}'),
              (400, b'{"errors": [{"message": "bad query"}]}'), (401, b"unauthorized")]
PROXY_LIKE = [(407, b"<html>Proxy Authentication Required</html>", "407 Proxy Authentication Required"),
              (403, b"<html>Blocked by policy</html>", "403 Forbidden"), (502, b"<html>Bad gateway</html>", "502 Bad Gateway")]


@pytest.mark.parametrize("status, body", WANDB_LIKE)
def test_an_answer_from_a_wandb_server_is_reachable(local_server, monkeypatch, no_proxy, status, body):
    from vit.training.loggers import wandb_unreachable

    local_server.status, local_server.body = status, body
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{local_server.server_port}/")
    assert wandb_unreachable(5) is None


@pytest.mark.parametrize("status, body, said", PROXY_LIKE)
def test_a_proxys_answer_is_not_a_wandb_server(local_server, monkeypatch, no_proxy, status, body, said):
    """A proxy or gateway answering in the server's place: offline, with what it answered."""
    from vit.training.loggers import wandb_unreachable

    local_server.status, local_server.body = status, body
    url = f"http://127.0.0.1:{local_server.server_port}"
    monkeypatch.setenv("WANDB_BASE_URL", url)
    assert wandb_unreachable(5) == f"{url} answered HTTP {said}, which is not the server's own answer (a proxy or " \
                                   "gateway in the way?)"
    # the same proxy named by http_proxy, in front of a server it never reaches
    monkeypatch.setenv("WANDB_BASE_URL", "http://wandb.example.org")
    monkeypatch.setenv("http_proxy", url)
    assert wandb_unreachable(5).startswith(f"http://wandb.example.org answered HTTP {said}, ")
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")  # https: the proxy refuses the tunnel
    monkeypatch.setenv("https_proxy", url)
    assert wandb_unreachable(5) == f"https://wandb.example.org cannot be reached (Tunnel connection failed: {said})"


def test_the_probe_trusts_the_ca_bundle_wandb_would_use(tmp_path, monkeypatch, no_proxy, local_server):
    """A self-hosted W&B server with a certificate of the site's own CA: unknown to the system, trusted through
    REQUESTS_CA_BUNDLE (wandb's Python client, requests) or SSL_CERT_FILE (its uploader, wandb-core)."""
    import ssl

    from vit.training.loggers import wandb_unreachable

    if shutil.which("openssl") is None:
        pytest.skip("making a certificate needs the openssl command")
    cert, key = tmp_path / "site-ca.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    local_server.socket = context.wrap_socket(local_server.socket, server_side=True)
    local_server.body = b'{"data": {"__typename": "Query"}}'
    url = f"https://127.0.0.1:{local_server.server_port}"
    monkeypatch.setenv("WANDB_BASE_URL", url)
    assert "CERTIFICATE_VERIFY_FAILED" in wandb_unreachable(5)
    for variable in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"):
        monkeypatch.setenv(variable, str(cert))
        assert wandb_unreachable(5) is None, variable
        monkeypatch.delenv(variable)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "missing.pem"))
    assert wandb_unreachable(5) == f"{url} cannot be reached (REQUESTS_CA_BUNDLE={tmp_path / 'missing.pem'}: " \
                                   "No such file or directory)"


def test_netrc_credentials_of_a_self_hosted_server_are_found_as_wandb_finds_them(tmp_path, monkeypatch):
    """`wandb login --host URL` keeps the key in the netrc file under the server's host:port: the key of
    WANDB_BASE_URL's server counts, W&B's own server's entry does not count for it."""
    from vit.training.loggers import wandb_credentials_present

    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path))  # (no settings file of wandb's: its default server)
    monkeypatch.chdir(tmp_path)
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "a" * 40 + "\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org:8443")
    assert not wandb_credentials_present()
    netrc.write_text(netrc.read_text() + "machine wandb.example.org:8443\n  login user\n  password " + "b" * 40 + "\n")
    assert wandb_credentials_present()
    monkeypatch.delenv("WANDB_BASE_URL")
    assert wandb_credentials_present()  # api.wandb.ai's entry, for W&B's own server behind wandb's default URL
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    assert not wandb_credentials_present()
    monkeypatch.setenv("WANDB_API_KEY", "c" * 40)
    assert wandb_credentials_present()


def test_the_server_wandb_login_host_saved_is_the_one_checked(tmp_path, monkeypatch):
    """`wandb login --host URL` saves the server in wandb's settings file and its key in the netrc file: without
    WANDB_BASE_URL, that server's key is the one looked for, and that server the one asked."""
    from vit.training.loggers import wandb_base_url
    from vit.training.loggers import wandb_credentials_present

    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "settings").write_text("[default]\nbase_url = https://wandb.example.org:8443\n")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    netrc = tmp_path / "netrc"
    netrc.write_text("machine wandb.example.org:8443\n  login user\n  password " + "b" * 40 + "\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    assert wandb_base_url() == "https://wandb.example.org:8443" and wandb_credentials_present()
    monkeypatch.setenv("WANDB_BASE_URL", "https://other.example.org")  # the variable comes first, as in wandb
    assert wandb_base_url() == "https://other.example.org" and not wandb_credentials_present()


def test_a_run_behind_a_proxy_that_asks_for_credentials_trains_offline_at_once(tmp_path, fake_cifar_session,
                                                                             local_server, monkeypatch, no_proxy, caplog):
    """As a user runs it (W&B on, the progress bar): credentials set, and a proxy answering 407 for the W&B
    server. The run logs offline into its folder from the start, with one line that names the answer."""
    from vit.commands.train import main

    local_server.status, local_server.body = 407, b"<html>Proxy Authentication Required</html>"
    url = f"http://127.0.0.1:{local_server.server_port}"
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef0123456789abcdef01234567")
    monkeypatch.setenv("WANDB_BASE_URL", url)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    assert main(["--config", "smoke", "--data.root", str(fake_cifar_session), "--data.val_size", "100",
                 "--data.num_workers", "0", "--data.batch_size", "50", "--trainer.max_epochs", "1",
                 "--test_after_fit", "false", "--model.arch.dim", "32", "--model.arch.depth", "1",  # a smaller model
                 "--model.arch.heads", "2"]) == 0
    run = Path("runs/smoke/version_0")
    line = (f"wandb: {url} answered HTTP 407 Proxy Authentication Required, which is not the server's own answer (a "
            f"proxy or gateway in the way?); logging offline into {run}/wandb; upload later with `vit-sync "
            f"{run}` on a machine with network")
    assert [r.getMessage() for r in caplog.records].count(line) == 1, caplog.text[-3000:]
    assert len(list((tmp_path / run / "wandb").glob("offline-run-*"))) == 1
    print(f"a run behind a 407 proxy: {time.monotonic() - start:.1f} s")


def test_each_start_of_a_run_resumes_its_w_and_b_run(tmp_path, monkeypatch):
    """vit-train's config passes every argument of wandb.init, ``resume: null`` among them, under which a later
    start of the run (a resume, a requeued job) would replace the W&B run's history: the logger resumes it."""
    import wandb

    from vit.training.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = WandbLogger(save_dir=str(tmp_path), id="abcd1234", resume=None)
    try:
        assert logger.experiment.id == "abcd1234" and logger.experiment.settings.resume == "allow"
    finally:
        wandb.finish()


@pytest.mark.parametrize("option,value", [("resume", "never"), ("resume", "must"), ("resume", False),
                                          ("fork_from", "abcd1234?_step=10"), ("resume_from", "abcd1234?_step=10")])
def test_w_and_b_options_that_would_not_go_on_after_a_resume_are_refused(tmp_path, monkeypatch, option, value):
    """Every start of a run logs to its one W&B run, going on after what it logged: a resume mode or a fork that
    would fail at a later start, replace the history or rewind it is refused in one line, before any work."""
    from vit.exits import ConfigError
    from vit.training.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(ConfigError, match=f"^--trainer.logger.init_args.{option}"):
        WandbLogger(save_dir=str(tmp_path), **{option: value})
    assert WandbLogger(save_dir=str(tmp_path), resume="allow")._wandb_init["resume"] == "allow"
