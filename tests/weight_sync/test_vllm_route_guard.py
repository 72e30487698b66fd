"""The key on vLLM's development routes (ENG-1), checked in-process on a stand-in app.

`tests/inference/test_vllm.py` checks the same against real vLLM, which loads the
guard through its `--middleware` flag; this module needs no vLLM.
"""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from atroposlib.weight_sync.vllm_route_guard import WeightRouteGuard, guard_launch_extras, sampling


def serving_app() -> Starlette:
    async def ok(request):
        return JSONResponse({"path": request.url.path})

    paths = ["/health", "/v1/models", "/collective_rpc", "/pause", "/v1/load_lora_adapter"]
    app = Starlette(routes=[Route(p, ok, methods=["GET", "POST"]) for p in paths])
    app.add_middleware(WeightRouteGuard)  # as vLLM's --middleware does
    return app


@pytest.fixture
def keyed(monkeypatch):
    for name in ("ATROPOS_ENGINE_API_KEY", "VLLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ATROPOS_WEIGHT_SYNC_KEY", "sync")
    return TestClient(serving_app(), base_url="http://127.0.0.1")


JSON = {"Content-Type": "application/json"}


def test_weight_routes_need_the_key_and_the_rest_is_left_to_vllm(keyed):
    for path in ("/collective_rpc", "/pause", "/v1/load_lora_adapter"):
        assert keyed.post(path, headers=JSON).status_code == 401
        for wrong in ("Bearer wrong", "Basic sync"):
            assert keyed.post(path, headers={**JSON, "Authorization": wrong}).status_code == 401
        assert keyed.post(path, headers={**JSON, "Authorization": "Bearer sync"}).status_code == 200
    assert keyed.get("/health").status_code == 200
    assert keyed.get("/v1/models").status_code == 200  # vLLM's own --api-key guards /v1


def test_the_engine_api_key_opens_none_of_them(monkeypatch):
    """ENG-A of the security review: the guard took the engine key, which every
    environment holds to sample, so any environment could replace the weights. Only the
    weight-sync key opens them now, as a bearer or beside vLLM's own engine key."""
    from atroposlib.weight_sync.vllm import weight_route_headers

    monkeypatch.setenv("ATROPOS_WEIGHT_SYNC_KEY", "sync")
    monkeypatch.setenv("VLLM_API_KEY", "engine")
    monkeypatch.setenv("ATROPOS_ENGINE_API_KEY", "engine")
    client = TestClient(serving_app(), base_url="http://127.0.0.1")
    for path in ("/pause", "/collective_rpc", "/v1/load_lora_adapter"):
        engine_key = {**JSON, "Authorization": "Bearer engine"}
        assert client.post(path, headers=engine_key).status_code == 401
        both = {**engine_key, "X-Weight-Sync-Key": "sync"}
        assert client.post(path, headers=both).status_code == 200
        wrong = {**engine_key, "X-Weight-Sync-Key": "engine"}
        assert client.post(path, headers=wrong).status_code == 401
    # what the trainer sends: vLLM's /v1 check gets the engine key, the guard the sync key
    assert weight_route_headers("sync") == both
    assert client.post("/pause", headers=weight_route_headers("sync")).status_code == 200


def test_the_sampling_routes_take_the_engine_key_here_whatever_vllm_checks(monkeypatch):
    """ENG-B of the security review: the guard left /v1, /v2, /inference and /cohere to
    vLLM's own --api-key check, whose coverage changed between vLLM versions. With an
    engine key in the engine's environment, the guard checks them itself."""
    monkeypatch.setenv("ATROPOS_WEIGHT_SYNC_KEY", "sync")
    monkeypatch.setenv("VLLM_API_KEY", "engine")
    monkeypatch.delenv("ATROPOS_ENGINE_API_KEY", raising=False)
    client = TestClient(serving_app(), base_url="http://127.0.0.1")
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    for key in ("engine", "sync"):
        assert (
            client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        )
    assert client.get("/health").status_code == 200
    refused = client.post("/pause", headers={**JSON, "Authorization": "Bearer engine"})
    assert refused.status_code == 401 and "weight-sync key" in refused.text


def test_without_any_key_every_weight_route_is_closed(monkeypatch):
    for name in ("ATROPOS_WEIGHT_SYNC_KEY", "ATROPOS_ENGINE_API_KEY", "VLLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    client = TestClient(serving_app(), base_url="http://127.0.0.1")
    for bearer in ("Bearer ", "Bearer None", "Bearer null"):
        answer = client.post("/collective_rpc", headers={**JSON, "Authorization": bearer})
        assert answer.status_code == 401
    assert client.get("/health").status_code == 200


def test_which_paths_are_guarded_and_how_vllm_is_told():
    assert sampling("/v1/chat/completions") and sampling("/inference/v1/generate")
    assert not sampling("/v1/unload_lora_adapter") and not sampling("/update_weights")
    args, env = guard_launch_extras("k")
    assert args == ["--middleware", "atroposlib.weight_sync.vllm_route_guard.WeightRouteGuard"]
    assert env["ATROPOS_WEIGHT_SYNC_KEY"] == "k" and env["PYTHONPATH"]
