"""On PYTHONPATH (tests/test_figures.py's ``run_figures(offline=True)``): this process and the ones it starts have
no network. A connection to another machine raises OSError, as on a node without a route; this machine's own
sockets (the compile workers', W&B offline's) still connect."""

import socket

_connect = socket.socket.connect


def _local_only(self, address):
    host = address[0] if isinstance(address, tuple) else None
    if host is not None and host not in ("127.0.0.1", "::1", "localhost", "0.0.0.0"):
        raise OSError(101, f"network blocked by the test (tests/offline/sitecustomize.py): {host}")
    return _connect(self, address)


socket.socket.connect = _local_only
