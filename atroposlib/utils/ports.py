"""TCP ports on 127.0.0.1: one chosen free at run time, or whether one is taken."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now (the OS picks it; another process may take it later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_ports(count: int) -> int:
    """The first of `count` consecutive ports nothing listens on now (e.g. one engine
    each on --engine-port, --engine-port + 1, ...)."""
    while True:
        first = free_port()
        if first + count <= 65536 and not any(port_in_use(first + i) for i in range(1, count)):
            return first


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False
