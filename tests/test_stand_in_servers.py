"""The scaffold of the tests' stand-in HTTP servers (tests/support/json_http.py)."""

from __future__ import annotations

import contextlib
import io
import socket
import struct
import time

import pytest

from tests.support.json_http import JsonHandler, LocalHttpServer

pytestmark = pytest.mark.integration  # a real socket on 127.0.0.1


class SlowBigAnswer(JsonHandler):
    def do_POST(self) -> None:
        time.sleep(0.3)  # the client hangs up meanwhile
        self._answer(200, {"text": "x" * 1_000_000})


class Broken(JsonHandler):
    def do_POST(self) -> None:
        raise ValueError("a stand-in's own bug")


def printed_by(handler: type[JsonHandler], hang_up: bool) -> str:
    """What the server printed on stderr while it served one POST."""
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed), LocalHttpServer(handler) as server:
        port = int(server.url.rsplit(":", 1)[1])
        client = socket.create_connection(("127.0.0.1", port))
        client.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        if hang_up:  # an RST, as a killed or stopped client leaves
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
        else:
            client.recv(1024)
            client.close()
        time.sleep(1)  # the handler's thread finishes (and would print) meanwhile
    return printed.getvalue()


def test_a_client_that_hangs_up_prints_no_traceback_and_a_handlers_bug_does():
    """In-process env runs capture this process's stderr and fail on a traceback there:
    an env stopped mid-request is no error, a stand-in's own exception is."""
    assert printed_by(SlowBigAnswer, hang_up=True) == ""
    assert "ValueError: a stand-in's own bug" in printed_by(Broken, hang_up=False)
