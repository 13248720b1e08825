"""Whether a server answers from here (the W&B server, a dataset's mirror), asked through the environment's
proxies (https_proxy, no_proxy) and trusting its CA bundles, within a bounded time: a compute node without a
route out is told at once, not after a library's own minutes of retries."""

from __future__ import annotations

import os
import threading


def ca_context():
    """A TLS context that trusts what wandb's HTTP clients trust: the system's certificates or SSL_CERT_FILE /
    SSL_CERT_DIR (OpenSSL's variables, which wandb's uploader, wandb-core, reads too), and the bundle of
    REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE (read by requests, wandb's Python client). A variable that names no
    file or folder raises OSError naming it."""
    import ssl

    context = ssl.create_default_context()
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        bundle = os.environ.get(name)
        if bundle:
            try:
                if os.path.isdir(bundle):
                    context.load_verify_locations(capath=bundle)
                else:
                    context.load_verify_locations(cafile=bundle)
            except (OSError, ssl.SSLError) as e:
                raise OSError(f"{name}={bundle}: {getattr(e, 'strerror', None) or e}") from None
            break  # requests reads the first one set
    return context


def unreachable(url: str, timeout: float, data: bytes | None = None, accept=None) -> str | None:
    """Why ``url`` cannot be reached from here ("did not answer within ...", "cannot be reached (...)",
    "answered HTTP 407 ..."), or None when it answers within ``timeout`` seconds. ``data``: POSTed as JSON;
    ``accept(status, body)``: whether an answer is the server's own (default: any HTTP answer is). Proxies
    (https_proxy, no_proxy) and CA bundles (``ca_context``) are those of the environment. DNS, connect and
    the answer together are bounded: the probe runs in a thread that is left behind when it takes longer."""
    import urllib.error
    import urllib.request

    failed: list[str] = []

    def probe() -> None:
        request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=ca_context()) as answer:
                status, body = answer.status, answer.read(65536)
        except urllib.error.HTTPError as e:  # the server (or what stands in its way) answered
            status, body = e.code, b""
            try:
                body = e.read(65536) if e.fp else b""
            except OSError:  # (an answer cut short: its status still says who answered)
                pass
        except OSError as e:  # URLError, a refused or reset connection, a timeout, TLS, a CA bundle: no route there
            failed.append(f"cannot be reached ({getattr(e, 'reason', e)})")
            return
        if accept is not None and not accept(status, body):
            import http

            try:
                phrase = f" {http.HTTPStatus(status).phrase}"
            except ValueError:
                phrase = ""
            failed.append(f"answered HTTP {status}{phrase}, which is not the server's own answer (a proxy or gateway "
                          "in the way?)")

    thread = threading.Thread(target=probe, name="url-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return f"did not answer within {timeout:g} s"
    return failed[0] if failed else None
