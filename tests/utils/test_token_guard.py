"""The browser cookie of a token-guarded listener: a random session, kept and expiring.

VIEW-1 of the correctness review: the cookie was a fixed hash of the token with no
expiry, and browsers send a host's cookies to every port of it, so any other service
on the host could replay it for ever.
"""

from __future__ import annotations

import hashlib
import hmac

from fastapi import FastAPI
from fastapi.testclient import TestClient

from atroposlib.utils import token_guard
from atroposlib.utils.token_guard import TokenGuard

TOKEN = "s3cret"
COOKIE = "atropos_view"


def guarded() -> tuple[TestClient, TokenGuard]:
    app = FastAPI()

    @app.get("/")
    def page() -> dict[str, str]:
        return {"page": "ok"}

    guard = TokenGuard(app, TOKEN, cookie_name=COOKIE)
    return TestClient(guard, base_url="http://127.0.0.1:7860"), guard


def log_in(client: TestClient) -> str:
    """A new browser opening the page's ?token= address; its session cookie."""
    client.cookies.clear()
    entry = client.get("/", params={"token": TOKEN}, follow_redirects=False)
    assert entry.status_code == 303
    assert f"Max-Age={token_guard.SESSION_MAX_AGE_S}" in entry.headers["set-cookie"]
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
    session = log_in(client)
    client.cookies.set(COOKIE, session)
    assert client.get("/").status_code == 200
    guard.sessions[session] = 0.0  # past: time.monotonic() is always later
    assert client.get("/").status_code == 401
    assert session not in guard.sessions


def test_open_sessions_are_bounded(monkeypatch):
    monkeypatch.setattr(token_guard, "MAX_SESSIONS", 3)
    client, guard = guarded()
    sessions = [log_in(client) for _ in range(5)]
    assert list(guard.sessions) == sessions[2:]  # the oldest were forgotten
