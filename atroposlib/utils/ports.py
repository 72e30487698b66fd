"""TCP ports on 127.0.0.1: one chosen free at run time, or whether one is taken."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now (the OS picks it; another process may take it later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False
