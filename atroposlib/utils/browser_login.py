"""How a browser proves a listener's token: once in the address, then by a session cookie.

API clients send `Authorization: Bearer <token>`. A browser cannot add that header to
the requests a page makes, so a listener with `browser_cookie` (the viewer) also takes
the token once as `?token=<token>` on a GET: it answers with a redirect to the same URL
without the token and sets an HttpOnly cookie that proves it from then on. Token
comparison is constant-time. `RequestGuard` asks this after the bearer check.

The cookie is a random session id kept here, for `SESSION_MAX_AGE_S` at most. It used
to be a fixed hash of the token with no expiry, and browsers send a host's cookies to
every port of that host, so any other service there could replay it for ever (VIEW-1 of
the correctness review). A session id that leaks now expires, and dies with the process.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, urlencode

from starlette.types import Scope, Send

QUERY_PARAMETER = "token"
SESSION_MAX_AGE_S = 12 * 3600
MAX_SESSIONS = 1024
"""Open sessions kept; the oldest is forgotten first (its browser asks ?token= again)."""


class BrowserLogin:
    """The sessions of the browsers that gave `token` in the address, under `cookie_name`."""

    def __init__(self, token: str, cookie_name: str) -> None:
        if not token:
            raise ValueError("BrowserLogin needs a non-empty token")
        self.token = token.encode()
        self.cookie_name = cookie_name
        self.sessions: OrderedDict[str, float] = OrderedDict()
        """Session id -> when it expires (time.monotonic())."""

    def has_session(self, headers: dict[bytes, bytes]) -> bool:
        """Whether the request carries the cookie of a session that has not expired."""
        if b"cookie" not in headers:
            return False
        jar: SimpleCookie = SimpleCookie()
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

    def address_login(self, scope: Scope) -> list[tuple[str, str]] | None:
        """The rest of the query when a GET gives the token as `?token=`, else None."""
        if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD"):
            return None
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        offered = [value for key, value in query if key == QUERY_PARAMETER]
        if not offered or not hmac.compare_digest(offered[-1].encode(), self.token):
            return None
        return [(key, value) for key, value in query if key != QUERY_PARAMETER]

    async def redirect_with_cookie(
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

    def _new_session(self) -> str:
        session = secrets.token_urlsafe(32)
        self.sessions[session] = time.monotonic() + SESSION_MAX_AGE_S
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)
        return session
