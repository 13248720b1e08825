"""Bounded-time reachability checks, so a node without network fails fast instead of after minutes of retries."""

from __future__ import annotations

import os
import threading


def ca_context():
    """A TLS context trusting what wandb trusts: system CAs, SSL_CERT_*, and REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE."""
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
    """Why ``url`` cannot be reached, or None if it answers within ``timeout`` seconds (DNS and connect included).
    ``data`` is POSTed as JSON; ``accept(status, body)`` says whether an answer is the server's own, not a proxy's."""
    import urllib.error
    import urllib.request

    failed: list[str] = []

    def probe() -> None:
        request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=ca_context()) as answer:
                status, body = answer.status, answer.read(65536)
        except urllib.error.HTTPError as e:  # the server, or a proxy in front of it, answered
            status, body = e.code, b""
            try:
                body = e.read(65536) if e.fp else b""
            except OSError:  # truncated body: the status is still usable
                pass
        except OSError as e:  # URLError, refused/reset connection, timeout, TLS or CA error
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
