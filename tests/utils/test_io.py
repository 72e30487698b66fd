"""parse_http_response against a real aiohttp server on a free 127.0.0.1 port.

The same answers are read through aiohttp (as upstream's BaseEnv does) and through httpx.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import aiohttp
import httpx
import pytest
from aiohttp import web

from atroposlib.utils.io import HTTPResponseError, parse_http_response
from atroposlib.utils.ports import free_port

PAYLOAD = {"batch": [{"tokens": [1, 2, 3]}], "status": "ok"}
REFUSAL = {"detail": "group too long: 900 tokens > max_token_len 512"}


async def ok(request: web.Request) -> web.Response:
    return web.json_response(PAYLOAD)


async def refused(request: web.Request) -> web.Response:
    return web.json_response(REFUSAL, status=422)


async def crashed(request: web.Request) -> web.Response:
    return web.Response(status=500, text="Internal Server Error: database on fire")


async def not_json(request: web.Request) -> web.Response:
    return web.Response(
        status=200, text="<html>a proxy login page</html>", content_type="text/html"
    )


async def moved(request: web.Request) -> web.Response:
    return web.Response(status=302, headers={"Location": "/ok"}, text="see /ok")


@pytest.fixture
async def server() -> AsyncIterator[str]:
    app = web.Application()
    for path, handler in [
        ("/ok", ok),
        ("/refused", refused),
        ("/crashed", crashed),
        ("/not-json", not_json),
        ("/moved", moved),
    ]:
        app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.mark.integration
async def test_aiohttp_json_body(server):
    async with aiohttp.ClientSession() as session, session.get(f"{server}/ok") as resp:
        assert await parse_http_response(resp, logging.getLogger("test")) == PAYLOAD


@pytest.mark.integration
async def test_httpx_json_body(server):
    async with httpx.AsyncClient() as client:
        resp = await client.get(f"{server}/ok")
    assert await parse_http_response(resp) == PAYLOAD


@pytest.mark.integration
async def test_aiohttp_error_status_keeps_its_type_and_shows_the_body(server, caplog):
    logger = logging.getLogger("env-under-test")
    with caplog.at_level(logging.ERROR, logger="env-under-test"):
        async with aiohttp.ClientSession() as session, session.get(f"{server}/refused") as resp:
            with pytest.raises(aiohttp.ClientResponseError) as caught:
                await parse_http_response(resp, logger)
    assert caught.value.status == 422
    assert "422" in str(caught.value) and REFUSAL["detail"] in str(caught.value)
    assert any(REFUSAL["detail"] in r.getMessage() for r in caplog.records)


@pytest.mark.integration
async def test_httpx_error_status_keeps_its_type_and_shows_the_body(server):
    async with httpx.AsyncClient() as client:
        resp = await client.get(f"{server}/crashed")
    with pytest.raises(httpx.HTTPStatusError) as caught:
        await parse_http_response(resp)
    assert caught.value.response.status_code == 500
    assert "500" in str(caught.value) and "database on fire" in str(caught.value)


@pytest.mark.integration
async def test_redirect_not_followed_is_an_error_for_both_clients(server):
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{server}/moved", allow_redirects=False) as resp:
            with pytest.raises(aiohttp.ClientResponseError, match="302.*see /ok"):
                await parse_http_response(resp)
    async with httpx.AsyncClient() as client:
        resp = await client.get(f"{server}/moved")
    with pytest.raises(httpx.HTTPStatusError, match="302.*see /ok"):
        await parse_http_response(resp)


@pytest.mark.integration
async def test_non_json_success_body_is_logged_and_reraised(server, caplog):
    logger = logging.getLogger("env-under-test")
    with caplog.at_level(logging.ERROR, logger="env-under-test"):
        async with aiohttp.ClientSession() as session, session.get(f"{server}/not-json") as resp:
            with pytest.raises(aiohttp.ContentTypeError):
                await parse_http_response(resp, logger)
        async with httpx.AsyncClient() as client:
            resp = await client.get(f"{server}/not-json")
        with pytest.raises(json.JSONDecodeError):
            await parse_http_response(resp, logger)
    logged = [r.getMessage() for r in caplog.records if r.name == logger.name]
    assert len(logged) == 2 and all("a proxy login page" in m for m in logged)


class PlainResponse:
    """A response object of neither library: status and text only."""

    def __init__(self, status: int, text: str) -> None:
        self.status = status
        self._text = text

    def raise_for_status(self) -> None:  # pragma: no cover - the status is checked first
        raise AssertionError("parse_http_response should have judged the status itself")

    async def text(self) -> str:
        return self._text

    async def json(self):
        return json.loads(self._text)


async def test_other_response_objects_get_a_generic_error():
    assert await parse_http_response(PlainResponse(201, '{"a": 1}')) == {"a": 1}
    with pytest.raises(HTTPResponseError, match="HTTP 503: overloaded") as caught:
        await parse_http_response(PlainResponse(503, "overloaded"))
    assert (caught.value.status, caught.value.body) == (503, "overloaded")
