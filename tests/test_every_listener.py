"""Every listener a launched run starts, against the same attacks (item 2 of issue 46).

run-api, the CPU engine, the environment's proxy and vLLM (through the middleware it
loads, `weight_sync/vllm_route_guard.py`) each stand behind
`atroposlib.utils.request_guard.RequestGuard`. Here each is built in this process (vLLM
as a stand-in app under its middleware), keyed and keyless, and each gets the same
requests: what a DNS-rebinding page, a cross-site
form or image, a blind `text/plain` post, a nested or oversized body and a keyless
client can send. Each is refused with the same status and the same error shape, before
any route runs. (Real vLLM under the guard: inference/test_vllm.py; its key rules:
weight_sync/test_vllm_route_guard.py; the viewer's page, viewer/test_viewer_exposure.py.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from atroposlib.api.server import create_app as api_app
from atroposlib.api.settings import APISettings
from atroposlib.envs.server_handling.managed_server_proxy import create_app as proxy_app
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.utils.request_guard import CHAT_MAX_BODY_BYTES
from atroposlib.weight_sync.vllm_route_guard import WeightRouteGuard
from tests.support.inference_servers import server_config

pytestmark = pytest.mark.integration

KEY = "the-listeners-key"
LOCAL = "http://127.0.0.1"


@dataclass(frozen=True)
class Listener:
    name: str
    get_path: str  # a guarded read
    post_path: str  # a guarded write


LISTENERS = [
    Listener("run-api", "/status", "/scored_data"),
    Listener("engine", "/v1/models", "/v1/completions"),
    Listener("proxy", "/sessions", "/sessions/create"),
    Listener("vllm", "/v1/models", "/v1/completions"),
]
MAX_BODY_MB = CHAT_MAX_BODY_BYTES / 2**20  # the engine's and the proxy's; run-api's is set to it


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    from atroposlib.inference.sampler import TransformersSampler

    return TransformersSampler.load(str(tiny_model_path))


def vllm_stand_in(key: str | None, monkeypatch) -> Starlette:
    """vLLM's routes as echoes, under the middleware vLLM loads; `key`: its engine key
    (the weight-sync key is always set, as the launcher sets it)."""

    async def echo(request):
        return JSONResponse({"path": request.url.path})

    monkeypatch.setenv("ATROPOS_WEIGHT_SYNC_KEY", "the-sync-key")
    monkeypatch.delenv("ATROPOS_ENGINE_API_KEY", raising=False)
    if key:
        monkeypatch.setenv("VLLM_API_KEY", key)
    else:
        monkeypatch.delenv("VLLM_API_KEY", raising=False)
    paths = ["/health", "/v1/models", "/v1/completions"]
    app = Starlette(routes=[Route(path, echo, methods=["GET", "POST"]) for path in paths])
    app.add_middleware(WeightRouteGuard)
    return app


@contextmanager
def served(
    listener: Listener, key: str | None, engine, tmp_path, monkeypatch
) -> Iterator[TestClient]:
    if listener.name == "run-api":
        state_dir = str(tmp_path / "state")
        app = api_app(APISettings(state_dir=state_dir, api_key=key, max_body_mb=MAX_BODY_MB))
    elif listener.name == "engine":
        from atroposlib.inference.server import create_inference_app

        app = create_inference_app(engine, "tiny", api_key=key)
    elif listener.name == "vllm":
        app = vllm_stand_in(key, monkeypatch)
    else:
        nowhere = ServerManager([server_config("http://127.0.0.1:9", timeout=1)])
        app = proxy_app(nowhere, engine.tokenizer, "tiny", api_key=key)
    with TestClient(app, base_url=LOCAL) as client:
        yield client


def refused(answer, status: int) -> str:
    """The refusal's message, after checking its status and its one shape."""
    assert answer.status_code == status, (answer.status_code, answer.text)
    body = answer.json()
    assert body["error"]["code"] == status and body["error"]["message"] == body["detail"]
    return body["detail"]


@pytest.mark.parametrize("listener", LISTENERS, ids=lambda listener: listener.name)
@pytest.mark.parametrize("keyed", [False, True], ids=["keyless", "keyed"])
def test_each_listener_refuses_the_same_attacks_the_same_way(
    listener, keyed, engine, tmp_path, monkeypatch
):
    key = KEY if keyed else None
    auth = {"Authorization": f"Bearer {KEY}"} if keyed else {}
    with served(listener, key, engine, tmp_path, monkeypatch) as http:
        assert http.get("/health").status_code == 200
        if keyed:  # no key, a wrong key: 401, with the header that says how
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                answer = http.get(listener.get_path, headers=headers)
                assert "Authorization: Bearer" in refused(answer, 401)
                assert answer.headers["www-authenticate"] == "Bearer"
        else:  # a DNS-rebinding page names its own host
            answer = http.get(listener.get_path, headers={"Host": "attacker.example"})
            assert "attacker.example" in refused(answer, 400)
        for site in ("cross-site", "same-site"):  # another site's <img>, form or fetch
            answer = http.get(listener.get_path, headers={**auth, "Sec-Fetch-Site": site})
            assert "another site" in refused(answer, 403)
        blind = {**auth, "Content-Type": "text/plain"}  # a form any page can post
        answer = http.post(listener.post_path, content=b"{}", headers=blind)
        assert "application/json" in refused(answer, 415)
        json_headers = {**auth, "Content-Type": "application/json"}
        nested = b"[" * 100 + b"]" * 100
        answer = http.post(listener.post_path, content=nested, headers=json_headers)
        assert "nests 100 levels" in refused(answer, 413)
        oversized = json.dumps(["x" * 1024] * (CHAT_MAX_BODY_BYTES // 1024 + 1)).encode()
        answer = http.post(listener.post_path, content=oversized, headers=json_headers)
        assert "limit" in refused(answer, 413)
        assert http.get(listener.get_path, headers=auth).status_code == 200  # a client is let in
