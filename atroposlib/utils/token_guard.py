"""An ASGI layer that lets through only requests carrying the listener's token.

API clients send `Authorization: Bearer <token>` (what the `openai` SDK and
atroposlib's clients send for `api_key`). A browser cannot add that header to the
requests a page makes, so a guard built with `cookie_name` also accepts the token
once as `?token=<token>` on a GET: it answers with a redirect to the same URL
without the token and sets an HttpOnly cookie that proves it from then on. Paths in
`open_paths` (health checks) need nothing. Token comparison is constant-time.

The cookie is a random session id that this guard keeps, for `SESSION_MAX_AGE_S`
at most. It used to be a fixed hash of the token with no expiry, and browsers send
a host's cookies to every port of that host, so any other service there could
replay it for ever (VIEW-1 of the correctness review). A session id that leaks now
expires, and dies with the process.
"""

from __future__ import annotations

import hmac
import json
import secrets
import time
from collections import OrderedDict
from collections.abc import Mapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.types import ASGIApp, Receive, Scope, Send

QUERY_PARAMETER = "token"
SESSION_MAX_AGE_S = 12 * 3600
MAX_SESSIONS = 1024
"""Open sessions kept; the oldest is forgotten first (its browser asks ?token= again)."""
UNAUTHORIZED_MESSAGE = "missing or wrong API key: send 'Authorization: Bearer <key>'"


def _matches(given: str | bytes, expected: bytes) -> bool:
    raw = given.encode() if isinstance(given, str) else given
    return hmac.compare_digest(raw, expected)


class TokenGuard:
    """Refuse every request without the token (401), except on `open_paths`."""

    def __init__(
        self,
        app: ASGIApp,
        token: str,
        open_paths: frozenset[str] = frozenset({"/health"}),
        cookie_name: str | None = None,
        unauthorized_body: Mapping[str, Any] | None = None,
    ) -> None:
        if not token:
            raise ValueError("TokenGuard needs a non-empty token")
        self.app = app
        self.token = token.encode()
        self.bearer = b"Bearer " + self.token
        self.open_paths = open_paths
        self.cookie_name = cookie_name
        self.sessions: OrderedDict[str, float] = OrderedDict()
        """Session id -> when it expires (time.monotonic())."""
        self.unauthorized_body = dict(unauthorized_body or {"detail": UNAUTHORIZED_MESSAGE})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if _matches(headers.get(b"authorization", b""), self.bearer) or self._cookie_ok(headers):
            await self.app(scope, receive, send)
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        offered = [value for key, value in query if key == QUERY_PARAMETER]
        if (
            self.cookie_name
            and scope["type"] == "http"
            and scope["method"] in ("GET", "HEAD")
            and offered
            and _matches(offered[-1], self.token)
        ):
            rest = [(key, value) for key, value in query if key != QUERY_PARAMETER]
            await self._redirect_with_cookie(scope, rest, send)
            return
        await self._refuse(scope, send)

    def _cookie_ok(self, headers: dict[bytes, bytes]) -> bool:
        if not self.cookie_name or b"cookie" not in headers:
            return False
        jar = SimpleCookie()
        try:
            jar.load(headers[b"cookie"].decode("latin-1"))
        except Exception:
            return False
        morsel = jar.get(self.cookie_name)
        if morsel is None:
            return False
        expires = self.sessions.get(morsel.value)
        if expires is None:
            return False
        if time.monotonic() >= expires:
            del self.sessions[morsel.value]
            return False
        return True

    def _new_session(self) -> str:
        session = secrets.token_urlsafe(32)
        self.sessions[session] = time.monotonic() + SESSION_MAX_AGE_S
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)
        return session

    async def _redirect_with_cookie(
        self, scope: Scope, rest: list[tuple[str, str]], send: Send
    ) -> None:
        """303 to the same path without `?token=`, so the token leaves the address bar."""
        location = scope.get("root_path", "") + scope["path"]
        if rest:
            location += "?" + urlencode(rest)
        cookie = (
            f"{self.cookie_name}={self._new_session()}; Path=/; Max-Age={SESSION_MAX_AGE_S}; "
            "HttpOnly; SameSite=Lax"
        )
        headers = [
            (b"location", location.encode("latin-1")),
            (b"set-cookie", cookie.encode("latin-1")),
            (b"cache-control", b"no-store"),
            (b"content-length", b"0"),
        ]
        await send({"type": "http.response.start", "status": 303, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    async def _refuse(self, scope: Scope, send: Send) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps(self.unauthorized_body).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer"),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
