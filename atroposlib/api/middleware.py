"""One ASGI layer in front of every route: auth, Host, content type, body size, gzip
bodies, the count of values in a body, latency.

Doing this in a single pure-ASGI pass (not Starlette's BaseHTTPMiddleware) keeps
the per-request cost to a few microseconds and reads the body exactly once.

Loopback is no trust boundary (docs/security.md): every local process, and every web
page a local browser opens, can reach 127.0.0.1. So, key or not, a state change must
say `Content-Type: application/json`, which no page can send to another origin
without the API's consent (a CORS preflight it never grants), unlike the `text/plain`
or form posts of a blind cross-site request. Without a key, the Host header must also
name the API as this machine knows it (localhost, an IP address, or --allowed-hosts),
which a DNS-rebinding page, whose own name now points at 127.0.0.1, cannot do.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import time
import types
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from atroposlib.api.models import ErrorDetail

_inflate: types.ModuleType  # isal_zlib or zlib: the same functions and `error`
try:  # ISA-L inflates gzip about twice as fast as zlib; same API
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover - optional speed-up
    _inflate = zlib

OPEN_PATHS = frozenset({"/", "/health"})
WRONG_CONTENT_TYPE = (
    "send the request as JSON, with 'Content-Type: application/json' (a body or not): "
    "run-api refuses other content types, which any web page can post to it"
)


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
        json_paths: frozenset[str] = frozenset(),
    ) -> None:
        """`allowed_hosts`: the Host names, besides localhost and IP addresses, that a
        request may name when there is no key (with one, the key is the check).
        `json_paths`: the paths that take a POST, which must be JSON (another method, or
        another path, is the router's 405 or 404)."""
        self.app = app
        self.json_paths = json_paths
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.allowed_hosts = allowed_hosts
        self.max_body_bytes = max_body_bytes
        self.max_body_values = max_body_values
        self.observe = observe
        self.known_paths = known_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
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

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"])
        if self.expected is not None and scope["path"] not in OPEN_PATHS:
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                await send_json(
                    send,
                    401,
                    {"detail": "missing or wrong API key: send 'Authorization: Bearer <key>'"},
                    {"WWW-Authenticate": "Bearer"},
                )
                return
        if self.expected is None and b"host" in headers and scope["path"] not in OPEN_PATHS:
            name = host_name(headers[b"host"])
            if not host_allowed(name, self.allowed_hosts):
                await send_json(send, 400, {"detail": wrong_host(name)})
                return
        if (
            scope["method"] == "POST"
            and scope["path"] in self.json_paths
            and not is_json(headers.get(b"content-type", b""))
        ):
            await send_json(send, 415, {"detail": WRONG_CONTENT_TYPE})
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
                await send_json(send, 400, {"detail": f"Invalid gzip payload: {exc}"})
                return
        if self.max_body_values is not None and body.count(b",") >= self.max_body_values:
            # a cheap bound on the values before json builds an object for each
            await send_json(send, 413, {"detail": too_many_values(self.max_body_values)})
            return
        await self.app(scope, _replay(body, receive), send)

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
        await send_json(
            send, 413, {"detail": f"request body over the {limit_mb:g} MB limit (--max-body-mb)"}
        )


def too_many_values(limit: int) -> str:
    return (
        f"request body holds {limit:,} JSON values or more (--max-body-values): split the "
        "groups over several posts"
    )


def wrong_host(name: str) -> str:
    return (
        f"Host {name!r} is not this API's: without an API key, run-api answers only "
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


def document_guard(app: FastAPI, api_key_required: bool) -> None:
    """Add the guard's answers (and its bearer key) to every operation of `app`'s document.

    The guard answers before any route runs, so its codes hold for every path, present
    and future; documenting them here keeps the document true without each route
    repeating them.
    """
    build = app.openapi
    detail = {"application/json": {"schema": ErrorDetail.model_json_schema()}}
    answers: dict[str, dict[str, Any]] = {
        "400": {
            "description": "A gzip request body that does not inflate, or (without "
            "--api-key) a Host header that names neither localhost, an IP address nor one "
            "of --allowed-hosts.",
            "content": detail,
        },
        "413": {
            "description": "A request body over --max-body-mb, or holding --max-body-values "
            "JSON values or more.",
            "content": detail,
        },
    }
    not_json = {
        "description": "A POST without 'Content-Type: application/json'.",
        "content": detail,
    }
    unauthorized = {
        "description": "Missing or wrong 'Authorization: Bearer <key>' (--api-key).",
        "headers": {
            "WWW-Authenticate": {"required": True, "schema": {"type": "string", "const": "Bearer"}}
        },
        "content": detail,
    }

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = build()
        if api_key_required:
            schemes = document.setdefault("components", {}).setdefault("securitySchemes", {})
            schemes["bearer"] = {"type": "http", "scheme": "bearer"}
        for path, operations in document["paths"].items():
            for method, operation in operations.items():
                responses = operation.setdefault("responses", {})
                for code, answer in answers.items():
                    responses.setdefault(code, answer)
                if method == "post":
                    responses.setdefault("415", not_json)
                if api_key_required and path not in OPEN_PATHS:
                    operation["security"] = [{"bearer": []}]
                    responses.setdefault("401", unauthorized)
        return document

    app.openapi = openapi  # type: ignore[method-assign]
