"""Turn an HTTP response into its JSON body, or into an error that says what the server said.

Atropos code calls ``await parse_http_response(resp, logger)`` on aiohttp responses;
httpx responses are accepted too. The two differ (aiohttp's ``json()`` and
``text()`` are coroutines, httpx's ``json()`` is a method and ``text`` a property),
so both are read by duck typing.

A status outside 2xx raises the client library's own error type
(``aiohttp.ClientResponseError``, ``httpx.HTTPStatusError``), so retry decorators
and ``except`` clauses written for it keep working, but with the status and the
response body in its message: an API's refusal usually explains itself there.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

__all__ = ["HTTPResponseError", "parse_http_response"]

_module_logger = logging.getLogger(__name__)
BODY_LIMIT = 2000


class HTTPResponseError(RuntimeError):
    """A non-2xx answer from a response object that is neither aiohttp's nor httpx's."""

    def __init__(self, status: int, body: str, url: str = "") -> None:
        self.status = status
        self.body = body
        self.url = url
        super().__init__(_describe(status, body, url))


def _describe(status: int, body: str, url: str) -> str:
    where = f" from {url}" if url else ""
    shown = body if len(body) <= BODY_LIMIT else body[:BODY_LIMIT] + "...(truncated)"
    return f"HTTP {status}{where}: {shown or '(empty body)'}"


async def _resolve(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _status(resp: Any) -> int | None:
    status = getattr(resp, "status", None)
    if not isinstance(status, int):
        status = getattr(resp, "status_code", None)
    return status if isinstance(status, int) else None


async def _body_text(resp: Any) -> str:
    try:
        text = resp.text
        return str(await _resolve(text() if callable(text) else text))
    except Exception as error:  # the body may be gone (closed connection, bad encoding)
        return f"(body unreadable: {error})"


def _status_error(resp: Any, status: int, body: str) -> Exception:
    """The client library's own error type for a bad status, carrying the status and body."""
    url = str(getattr(resp, "url", "") or "")
    message = _describe(status, body, url)
    try:
        import aiohttp

        if isinstance(resp, aiohttp.ClientResponse):
            message = _describe(status, body, "")  # aiohttp's error text adds the URL itself
            return aiohttp.ClientResponseError(
                resp.request_info,
                resp.history,
                status=status,
                message=message,
                headers=resp.headers,
            )
    except ImportError:  # pragma: no cover - aiohttp is optional here
        pass
    try:
        import httpx

        if isinstance(resp, httpx.Response):
            return httpx.HTTPStatusError(message, request=resp.request, response=resp)
    except ImportError:  # pragma: no cover - httpx is a dependency
        pass
    return HTTPResponseError(status, body, url)


async def parse_http_response(resp: Any, logger: logging.Logger | None = None) -> Any:
    """The JSON body of ``resp`` (aiohttp ``ClientResponse`` or ``httpx.Response``).

    Raises the client's status error (message: status, URL and body) on a non-2xx
    status, and re-raises the decoding error when a 2xx body is not JSON; both are
    logged to ``logger`` (default: this module's) with the response text.
    """
    log = logger or _module_logger
    status = _status(resp)
    if status is not None and not 200 <= status < 300:
        body = await _body_text(resp)
        error = _status_error(resp, status, body)
        log.error("Error fetching from server. %s", error)
        raise error
    if status is None:  # an unknown response type: let it judge its own status
        try:
            resp.raise_for_status()
        except Exception as error:
            log.error("Error fetching from server: %s. Response: %s", error, await _body_text(resp))
            raise
    try:
        return await _resolve(resp.json())
    except Exception as error:
        body = await _body_text(resp)
        log.error("Error fetching from server. Status: %s, %s. Response: %s", status, error, body)
        raise
