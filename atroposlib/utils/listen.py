"""A server's listening socket, bound before the server does any work, and its serving.

run-api, atropos-inference-server, atropos-proxy and view-run bind their host:port
first, before they create a state dir, load a model or print uvicorn's start-up
lines, so a busy port is one line that names the address and what to do (exit code
2) instead of uvicorn's bind error (exit code 3) after the work. The bound socket
is handed to uvicorn, so nothing can take the port in between; Ctrl-C ends the
server with one line and exit code 0, as `uvicorn.run` exits, not a traceback.
"""

from __future__ import annotations

import errno
import socket
import sys
from typing import Any

KEEP_ALIVE_S = 75
"""How long an idle keep-alive connection stays open. uvicorn's 5 s equals httpx's (and
the openai SDK's) pool expiry, so under load a client reused a connection the server
was closing: "Server disconnected without sending a response" on a POST, which is not
retried. Outliving the clients' expiry leaves the closing to them, as nginx's 75 s does."""


class ListenError(RuntimeError):
    """The address cannot be listened on; the message says which one and what to do."""


def _advice(host: str, port: int, error: OSError) -> str:
    if error.errno == errno.EADDRINUSE:
        return (
            f"port {port} is in use by another process (a server of an earlier run? "
            f"`ss -ltnp 'sport = :{port}'` names it); stop it or pass --port with a free port"
        )
    if error.errno == errno.EACCES and 0 < port < 1024:
        return f"ports below 1024 need privileges; pass --port 1024 or above ({error.strerror})"
    reason = error.strerror or str(error)
    return (
        f"{reason}; pass --host with an address of this machine (127.0.0.1, or 0.0.0.0 for "
        "every interface)"
    )


def listen_socket(host: str, port: int) -> socket.socket:
    """`host:port` bound for a server (ListenError when it cannot be); port 0 picks one."""
    bare = host.strip("[]")
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    try:
        sock.bind((bare, port))
    except OSError as error:
        sock.close()
        raise ListenError(f"cannot listen on {host}:{port}: {_advice(host, port, error)}") from None
    return sock


def listen_problem(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on now, or None (for a server that binds itself)."""
    try:
        listen_socket(host, port).close()
    except ListenError as error:
        return str(error)
    return None


def serve(app: Any, sock: socket.socket, tool: str, **config: Any) -> int:
    """Serve `app` with uvicorn on `sock` until stopped; 0 after Ctrl-C, with one line."""
    import uvicorn

    settings = {"log_config": None, "timeout_keep_alive": KEEP_ALIVE_S, **config}
    server = uvicorn.Server(uvicorn.Config(app, **settings))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn stops gracefully, then raises the SIGINT it caught
        pass  # (where SIGINT was inherited ignored, a background job's, it raises nothing)
    finally:
        sock.close()
    print(f"{tool}: stopped", file=sys.stderr, flush=True)
    return 0
