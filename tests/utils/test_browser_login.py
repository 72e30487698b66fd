"""The browser cookie of a token-guarded listener (the viewer): a random session, kept
and expiring; and a WebSocket handshake checked as a request is.

VIEW-1 of the correctness review: the cookie was a fixed hash of the token with no
expiry, and browsers send a host's cookies to every port of it, so any other service
on the host could replay it for ever.
"""

from __future__ import annotations

import hashlib
import hmac

import pytest
from fastapi import FastAPI, WebSocket
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from atroposlib.utils import browser_login
from atroposlib.utils.browser_login import BrowserLogin
from atroposlib.utils.request_guard import RequestGuard

TOKEN = "s3cret"
COOKIE = "atropos_view"


def guarded(token: str | None = TOKEN) -> tuple[TestClient, BrowserLogin | None]:
    app = FastAPI()

    @app.get("/")
    def page() -> dict[str, str]:
        return {"page": "ok"}

    @app.websocket("/queue")
    async def queue(socket: WebSocket) -> None:
        await socket.accept()
        await socket.send_text("joined")
        await socket.close()

    guard = RequestGuard(
        app,
        token,
        max_body_bytes=1 << 20,
        open_paths=frozenset({"/health"}),
        listener="view-run",
        browser_cookie=COOKIE,
    )
    return TestClient(guard, base_url="http://127.0.0.1:7860"), guard.login


def log_in(client: TestClient) -> str:
    """A new browser opening the page's ?token= address; its session cookie."""
    client.cookies.clear()
    entry = client.get("/", params={"token": TOKEN}, follow_redirects=False)
    assert entry.status_code == 303
    assert f"Max-Age={browser_login.SESSION_MAX_AGE_S}" in entry.headers["set-cookie"]
    return entry.cookies[COOKIE]


def test_each_login_gets_its_own_session_and_the_session_opens_the_page():
    client, _ = guarded()
    first, second = log_in(client), log_in(client)
    assert first != second and TOKEN not in first
    for session in (first, second):
        client.cookies.clear()
        client.cookies.set(COOKIE, session)
        assert client.get("/").json() == {"page": "ok"}


def test_the_old_fixed_cookie_and_a_guess_are_refused():
    client, _ = guarded()
    old = hmac.new(TOKEN.encode(), b"atropos-cookie", hashlib.sha256).hexdigest()
    for value in (old, TOKEN, "x" * 43):
        client.cookies.set(COOKIE, value)
        assert client.get("/").status_code == 401


def test_a_session_expires():
    client, guard = guarded()
    assert guard is not None
    session = log_in(client)
    client.cookies.set(COOKIE, session)
    assert client.get("/").status_code == 200
    guard.sessions[session] = 0.0  # past: time.monotonic() is always later
    assert client.get("/").status_code == 401
    assert session not in guard.sessions


def test_open_sessions_are_bounded(monkeypatch):
    monkeypatch.setattr(browser_login, "MAX_SESSIONS", 3)
    client, guard = guarded()
    assert guard is not None
    sessions = [log_in(client) for _ in range(5)]
    assert list(guard.sessions) == sessions[2:]  # the oldest were forgotten


def joins(client: TestClient, headers: dict[str, str] | None = None) -> bool:
    """Whether a WebSocket handshake to /queue gets through to the route."""
    try:
        with client.websocket_connect("/queue", headers=headers or {}) as socket:
            return socket.receive_text() == "joined"
    except WebSocketDisconnect as closed:
        assert closed.code == 1008
        return False


def test_a_websocket_handshake_is_checked_as_a_request_is():
    """Gradio's page speaks over a WebSocket too: the guard passed it through unchecked."""
    client, _ = guarded()
    assert not joins(client) and not joins(client, {"Authorization": "Bearer wrong"})
    assert joins(client, {"Authorization": f"Bearer {TOKEN}"})
    client.cookies.set(COOKIE, log_in(client))
    assert joins(client)
    assert not joins(client, {"Sec-Fetch-Site": "cross-site"})  # another site's page
    keyless, _ = guarded(token=None)
    assert joins(keyless, {"Host": "127.0.0.1:7860"})
    assert not joins(keyless, {"Host": "attacker.example"})  # a rebinding page


@pytest.mark.parametrize("token", [TOKEN, None])
def test_a_login_address_is_no_key_for_posts_or_other_tokens(token):
    client, _ = guarded(token)
    assert client.post("/", params={"token": TOKEN}, json={}).status_code in (401, 405)
    wrong = client.get("/", params={"token": "guess"}, follow_redirects=False)
    assert wrong.status_code == (401 if token else 200)
