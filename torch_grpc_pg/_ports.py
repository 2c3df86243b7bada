"""Free loopback ports, for the demo's torchrun, the benchmarks and the tests alike."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A port that is free now. Another process may take it before the caller binds it, so
    use it only where the one who binds it reports a clear error (a c10d store, torchrun)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
