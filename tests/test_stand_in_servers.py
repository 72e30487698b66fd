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


class ReadsJson(JsonHandler):
    def do_POST(self) -> None:
        self._answer(200, self.read_json())


class Broken(JsonHandler):
    def do_POST(self) -> None:
        raise ValueError("a stand-in's own bug")


def printed_by(handler: type[JsonHandler], hang_up: bool, sent: bytes = b"") -> str:
    """What the server printed on stderr while it served one POST (whose body says it
    is 100 bytes long when `sent` is a part of it)."""
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed), LocalHttpServer(handler) as server:
        port = int(server.url.rsplit(":", 1)[1])
        client = socket.create_connection(("127.0.0.1", port))
        length = 100 if sent else 0
        head = f"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n"
        client.sendall(head.encode() + sent)
        time.sleep(0.2)  # the handler is reading the body
        if hang_up:  # mid-body: a close; else an RST, as a killed client leaves
            if not sent:
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
    assert printed_by(ReadsJson, hang_up=True, sent=b'{"cut": ') == ""  # mid-body
    assert "ValueError: a stand-in's own bug" in printed_by(Broken, hang_up=False)
