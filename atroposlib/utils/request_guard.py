"""One ASGI layer in front of a listener's routes: key, Host, content type, body size,
gzip bodies, the values and nesting a body may hold, latency.

Doing this in a single pure-ASGI pass (not Starlette's BaseHTTPMiddleware) keeps the
per-request cost to a few microseconds and reads the body exactly once. Every listener
of a run stands behind it: run-api, the ManagedServer proxy (standalone and in process),
the CPU engine and its weight routes, and the viewer's page (whose browser gives the key
once, `browser_login`). A WebSocket handshake gets the same checks (refused: close 1008).

Loopback is no trust boundary (docs/security.md): every local process, and every web
page a local browser opens, can reach 127.0.0.1. So, key or not, a POST must say
`Content-Type: application/json`, which no page can send to another origin without the
listener's consent (a CORS preflight it never grants), unlike the `text/plain` or form
posts of a blind cross-site request. Without a key, the Host header must also name the
listener as this machine knows it (localhost, an IP address, or an allowed name), which
a DNS-rebinding page, whose own name now points at 127.0.0.1, cannot do. And a request
a browser marks as another site's (`Sec-Fetch-Site: cross-site` or `same-site`: an
`<img>`, a form, a script's fetch) is refused outright, so a page cannot even make a
GET that changes state, such as a keyless run-api's `/batch` (API-B of the review).
Programs send no such header and are not affected.

A body's values and depth are bounded before any parser sees it: `json` builds a Python
object per value (about 18 times the body's bytes), and a list costs one object with no
comma, so `[[[...]]]` is counted by its brackets as well as its commas (API-A of the
security review). Strings are left out of both counts: a chat message may quote code.

Every refusal has one shape, `{"detail": ..., "error": {"message", "type", "code"}}`:
FastAPI clients read `detail`, the `openai` SDK reads `error`.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re
import time
import types
import zlib
from collections.abc import Awaitable, Callable
from itertools import accumulate
from typing import Annotated, Any

from pydantic import BeforeValidator
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from atroposlib.utils.browser_login import BrowserLogin

_inflate: types.ModuleType  # isal_zlib or zlib: the same functions and `error`
try:  # ISA-L inflates gzip about twice as fast as zlib; same API
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover - optional speed-up
    _inflate = zlib

CHAT_MAX_BODY_BYTES = 16 << 20
"""Largest body an OpenAI-shaped listener (an engine, the proxy) takes: a conversation of
a few hundred thousand tokens."""
CHAT_MAX_BODY_VALUES = 1_000_000
"""Most JSON values in such a body: messages, tool schemas, a token-id prompt's ids."""
UNAUTHORIZED_MESSAGE = "missing or wrong API key: send 'Authorization: Bearer <key>'"
MAX_BODY_DEPTH = 64
"""Deepest nesting of lists and objects a body may have: the trainer's groups need 3,
chat tools' JSON schemas a dozen; `json`'s recursion fails near 1,000."""

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b",[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def _split_names(value: object) -> object:
    if isinstance(value, str):
        return [name.strip() for name in value.split(",") if name.strip()]
    return value


HostNames = Annotated[list[str], BeforeValidator(_split_names)]
"""A settings field of Host names, given as a list or as `a,b` on a command line."""
ALLOWED_HOSTS_HELP = (
    "Host names (comma-separated) that requests may be addressed to when there is no API "
    "key, besides localhost and IP addresses; '*' allows any. Other names get 400: a web "
    "page can point its own name at 127.0.0.1 (DNS rebinding)."
)


def error_payload(status: int, message: str) -> dict[str, Any]:
    """The refusal body every guarded listener sends (see the module docstring)."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return {"detail": message, "error": {"message": message, "type": kind, "code": status}}


def bears(headers: dict[bytes, bytes], key: str | None) -> bool:
    """Whether `headers` carry `Authorization: Bearer <key>` (in constant time); never
    for no key. The one comparison behind every second key a guard takes."""
    if not key:
        return False
    return hmac.compare_digest(headers.get(b"authorization", b""), f"Bearer {key}".encode())


def host_name(header: bytes) -> str:
    """The name a Host header gives, without its port: `[::1]:8000` -> `::1`."""
    text = header.decode("latin-1").strip().lower().rstrip(".")
    if text.startswith("["):
        return text[1:].partition("]")[0]
    return text.rpartition(":")[0] if text.count(":") == 1 else text


def host_allowed(name: str, allowed: frozenset[str]) -> bool:
    """localhost, an IP address (never a rebinding page's name) or an allowed name."""
    if name in allowed or "*" in allowed or name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def is_json(content_type: bytes) -> bool:
    media = content_type.partition(b";")[0].strip().lower()
    return media == b"application/json" or media.endswith(b"+json")


def values_and_depth(body: bytes) -> tuple[int, int]:
    """An upper bound on the JSON values `body` holds, and its deepest nesting, without
    parsing it (strings, and what they quote, are not counted)."""
    bare = _STRING.sub(b'""', body) if b'"' in body else body
    structure = bare.translate(None, _NOT_STRUCTURE)  # one pass; what is left is small
    brackets = structure.translate(None, b",")
    closing = brackets.count(b"]") + brackets.count(b"}")
    values = len(structure) - closing + 1  # a value per comma and per opening bracket
    depth = max(accumulate(_STEP[b] for b in brackets), default=0) if brackets else 0
    return values, depth


async def send_json(
    send: Send, status: int, payload: Any, headers: dict[str, str] | None = None
) -> None:
    body = json.dumps(payload).encode()
    raw_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


class BodyTooLarge(Exception):
    pass


def gunzip(data: bytes, limit: int) -> bytes:
    """Decompress one or more gzip members; refuses output over `limit` bytes."""
    out = bytearray()
    while data:
        decoder = _inflate.decompressobj(zlib.MAX_WBITS | 16)
        out += decoder.decompress(data, limit + 1 - len(out))
        if len(out) > limit:
            raise BodyTooLarge
        if decoder.unconsumed_tail:
            raise BodyTooLarge
        if not decoder.eof:
            raise zlib.error("truncated gzip stream")
        data = decoder.unused_data
    return bytes(out)


class RequestGuard:
    def __init__(
        self,
        app: ASGIApp,
        api_key: str | None,
        max_body_bytes: int,
        max_body_values: int | None = None,
        observe: Callable[[str, float], None] | None = None,
        known_paths: frozenset[str] = frozenset(),
        allowed_hosts: frozenset[str] = frozenset(),
        json_paths: frozenset[str] | None = None,
        open_paths: frozenset[str] = frozenset({"/", "/health"}),
        listener: str = "run-api",
        max_body_depth: int = MAX_BODY_DEPTH,
        also_authorized: Callable[[str, dict[bytes, bytes]], bool] | None = None,
        browser_cookie: str | None = None,
        unauthorized_message: str = UNAUTHORIZED_MESSAGE,
    ) -> None:
        """`allowed_hosts`: the Host names, besides localhost and IP addresses, that a
        request may name when there is no key (with one, the key is the check).
        `json_paths`: the paths whose POST must be JSON (None: every POST; another
        path is the router's 404 or 405). `also_authorized(path, headers)`: a key
        other than `api_key` that opens `path` (a proxy session's own bearer).
        `browser_cookie`: a browser may give the key once as `?token=` and is then
        known by this cookie (`browser_login`; a page's own requests carry no header)."""
        self.app = app
        self.json_paths = json_paths
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.allowed_hosts = allowed_hosts
        self.max_body_bytes = max_body_bytes
        self.max_body_values = max_body_values
        self.max_body_depth = max_body_depth
        self.observe = observe
        self.known_paths = known_paths
        self.open_paths = open_paths
        self.listener = listener
        self.also_authorized = also_authorized
        self.login = BrowserLogin(api_key, browser_cookie) if api_key and browser_cookie else None
        self.unauthorized_message = unauthorized_message

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            if self._websocket_refused(scope):
                await send({"type": "websocket.close", "code": 1008})  # policy violation
                return
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        try:
            await self._handle(scope, receive, send)
        finally:
            if self.observe is not None:
                path = scope["path"] if scope["path"] in self.known_paths else "other"
                self.observe(path, time.perf_counter() - started)

    async def _refuse(
        self, send: Send, status: int, message: str, headers: dict[str, str] | None = None
    ) -> None:
        await send_json(send, status, error_payload(status, message), headers)

    def _authorized(self, path: str, headers: dict[bytes, bytes]) -> bool:
        given = headers.get(b"authorization", b"")
        if self.expected is not None and hmac.compare_digest(given, self.expected):
            return True
        if self.login is not None and self.login.has_session(headers):
            return True
        return self.also_authorized is not None and self.also_authorized(path, headers)

    def _websocket_refused(self, scope: Scope) -> bool:
        """A handshake gets an HTTP request's checks of who is asking."""
        return self._who_is_refused(scope, dict(scope["headers"])) is not None

    def _who_is_refused(self, scope: Scope, headers: dict[bytes, bytes]) -> int | None:
        """The refusal's status for who is asking (another site's page 403, no key 401,
        a foreign Host without a key 400), or None."""
        path = scope["path"]
        if path in self.open_paths:
            return None
        if headers.get(b"sec-fetch-site", b"").lower() in (b"cross-site", b"same-site"):
            return 403
        if self.expected is not None:
            return None if self._authorized(path, headers) else 401
        if b"host" in headers and not host_allowed(host_name(headers[b"host"]), self.allowed_hosts):
            return 400
        return None

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"])
        path = scope["path"]
        refused = self._who_is_refused(scope, headers)
        if refused == 403:
            await self._refuse(send, 403, another_sites_page(self.listener))
            return
        if refused == 401:
            login = self.login.address_login(scope) if self.login is not None else None
            if self.login is not None and login is not None:
                await self.login.redirect_with_cookie(scope, login, send)
                return
            message = self.unauthorized_message
            await self._refuse(send, 401, message, {"WWW-Authenticate": "Bearer"})
            return
        if refused == 400:
            await self._refuse(send, 400, wrong_host(host_name(headers[b"host"]), self.listener))
            return
        if (
            scope["method"] == "POST"
            and (self.json_paths is None or path in self.json_paths)
            and not is_json(headers.get(b"content-type", b""))
        ):
            await self._refuse(send, 415, wrong_content_type(self.listener))
            return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._too_large(send)
            return
        try:
            body = await self._read_body(receive)
        except BodyTooLarge:
            await self._too_large(send)
            return
        if body and b"gzip" in headers.get(b"content-encoding", b"").lower():
            try:
                body = gunzip(body, self.max_body_bytes)
            except BodyTooLarge:
                await self._too_large(send)
                return
            except (zlib.error, _inflate.error) as exc:
                await self._refuse(send, 400, f"Invalid gzip payload: {exc}")
                return
        if body and (problem := self._shape_problem(body)):
            await self._refuse(send, 413, problem)
            return
        await self.app(scope, _replay(body, receive), send)

    def _shape_problem(self, body: bytes) -> str | None:
        """Why `body` holds too many values or nests too deep to parse, or None."""
        values, depth = values_and_depth(body)
        if self.max_body_values is not None and values >= self.max_body_values:
            return too_many_values(self.max_body_values)
        if depth > self.max_body_depth:
            return (
                f"request body nests {depth} levels of lists or objects; at most "
                f"{self.max_body_depth} are accepted"
            )
        return None

    async def _read_body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def _too_large(self, send: Send) -> None:
        limit_mb = self.max_body_bytes / 2**20
        await self._refuse(
            send, 413, f"request body over the {limit_mb:g} MB limit (--max-body-mb)"
        )


def another_sites_page(listener: str) -> str:
    return (
        f"{listener} refuses requests a browser makes for another site's page "
        "(Sec-Fetch-Site: cross-site or same-site): open it directly, or call it from a program"
    )


def too_many_values(limit: int) -> str:
    return (
        f"request body holds {limit:,} JSON values or more (--max-body-values): split the "
        "groups over several posts"
    )


def wrong_content_type(listener: str) -> str:
    return (
        "send the request as JSON, with 'Content-Type: application/json' (a body or not): "
        f"{listener} refuses other content types, which any web page can post to it"
    )


def wrong_host(name: str, listener: str = "run-api") -> str:
    return (
        f"Host {name!r} is not this listener's: without an API key, {listener} answers only "
        "requests addressed to localhost, an IP address or a name in --allowed-hosts, so "
        "that a web page that points its own name at 127.0.0.1 cannot read it; start it "
        f"with --allowed-hosts {name} (or --api-key)"
    )


def _replay(body: bytes, receive: Receive) -> Callable[[], Awaitable[Message]]:
    delivered = False

    async def replay() -> Message:
        nonlocal delivered
        if delivered:
            return await receive()
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
