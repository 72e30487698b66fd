"""Who reaches what on the ManagedServer proxy: findings PRX-1 to PRX-5 of the security
review of 356844e (../shared/reviews/security.md), each as its attack.

The proxy is served in this process (`serve_in_process`, as the agent environment
serves it, on a real loopback port) or mounted on an ASGI transport (`create_app`), over
`TokenScriptServer` backends that record the key each request carried. The attacker is
an HTTP client holding no key, or an agent holding only its session's key.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.testclient import TestClient

from atroposlib.envs.server_handling.managed_server_proxy import create_app, serve_in_process
from atroposlib.envs.server_handling.proxy_sessions import SessionLimits
from atroposlib.envs.server_handling.server_manager import ServerManager
from tests.support.inference_servers import server_config
from tests.support.token_script_server import TokenScriptServer

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.integration

RUN_KEY = "run-key-given-to-the-env-by-atropos-launch"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    return transformers.AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture
def launched_env_keys(monkeypatch):
    """What atropos-launch gives an environment: the run's key, pinned to its engine."""

    def give(engine_url: str) -> None:
        monkeypatch.setenv("ATROPOS_ENGINE_API_KEY", RUN_KEY)
        from atroposlib.utils.exposure import ENGINE_URLS_ENVIRONMENT  # PRX-1's fix

        monkeypatch.setenv(ENGINE_URLS_ENVIRONMENT, engine_url)

    return give


def test_prx1_no_local_process_can_rewire_the_envs_proxy_or_catch_the_runs_key(
    tokenizer, launched_env_keys
):
    """The review's attack on the in-process proxy: a keyless text/plain (and JSON)
    POST /setup pointing at the attacker's server. Nothing changes, and the run's key
    reaches the run's engine only, even after the env's own key rewires the backends."""
    from atroposlib.envs.server_handling.proxy_client import IN_PROCESS_PROXIES  # PRX-1's fix

    ids = tokenizer.encode("7", add_special_tokens=False)
    engine, catcher = TokenScriptServer([(ids, "stop")] * 4), TokenScriptServer([(ids, "stop")])
    launched_env_keys(engine.url)
    rewire = {"model_name": "tiny", "servers": [{"base_url": f"{catcher.url}/v1"}]}

    async def run() -> None:
        manager = ServerManager([server_config(engine.url)])
        async with proxy_in_process(manager, tokenizer) as url:
            service = IN_PROCESS_PROXIES[url]
            async with httpx.AsyncClient(base_url=url, timeout=30) as attacker:
                for headers in ({"Content-Type": "text/plain"}, {}):
                    sent = await attacker.post(
                        "/setup", content=json.dumps(rewire), headers=headers
                    )
                    assert sent.status_code == 401, sent.text
                assert (await attacker.get("/sessions")).status_code == 401
                assert (await attacker.post("/sessions/create", json={})).status_code == 401
                assert (await attacker.get("/health")).status_code == 200
            assert [s.config.base_url for s in manager.servers] == [f"{engine.url}/v1"]
            # the env's own rollout still goes where it should, with the run's key
            async with manager.managed_server(use_proxy=True) as managed:
                reply = await managed.chat_completion(messages=HI, max_tokens=4)
                assert reply.choices[0].message.content == "7"
            assert engine.authorizations == [f"Bearer {RUN_KEY}"]
            # even the env's own key, rewiring the proxy, sends the run's key nowhere new
            admin = {"Authorization": f"Bearer {service.api_key}"}
            async with httpx.AsyncClient(base_url=url, timeout=30, headers=admin) as env:
                assert (await env.post("/setup", json=rewire)).status_code == 200
                uuid = (await env.post("/sessions/create", json={})).json()["uuid"]
                path = f"/{uuid}/v1/chat/completions"
                answer = await env.post(path, json={"messages": HI, "max_tokens": 2})
                assert answer.status_code == 200, answer.text
            # one request, with the SDK's placeholder (it needs some key), not the run's
            assert catcher.authorizations == ["Bearer x"], "a /setup server inherits no key"

    try:
        asyncio.run(run())
    finally:
        engine.close()
        catcher.close()


def test_prx4_a_sessions_key_opens_its_own_completions_and_nothing_else(tokenizer):
    ids = tokenizer.encode("7", add_special_tokens=False)
    engine = TokenScriptServer([(ids, "stop")] * 4)

    async def run() -> None:
        manager = ServerManager([server_config(engine.url)])
        async with proxy_in_process(manager, tokenizer) as url:
            async with (
                manager.managed_server(use_proxy=True) as mine,
                manager.managed_server(use_proxy=True) as theirs,
            ):
                assert mine.api_key != theirs.api_key
                agent = {"Authorization": f"Bearer {mine.api_key}"}
                async with httpx.AsyncClient(base_url=url, timeout=30, headers=agent) as http:
                    body = {"messages": HI, "max_tokens": 2}
                    own = await http.post(f"/{mine.session_uuid}/v1/chat/completions", json=body)
                    assert own.status_code == 200, own.text
                    refused = [
                        await http.post(f"/{theirs.session_uuid}/v1/chat/completions", json=body),
                        await http.get("/sessions"),
                        await http.get(f"/{mine.session_uuid}/nodes"),
                        await http.get(f"/{theirs.session_uuid}/nodes"),
                        await http.delete(f"/{theirs.session_uuid}"),
                        await http.post("/sessions/create", json={}),
                        await http.post("/setup", json={"servers": []}),
                        await http.get("/servers"),
                    ]
                    assert [r.status_code for r in refused] == [401] * len(refused)
                    assert refused[0].json()["error"]["code"] == 401, "the SDK's error shape"
                assert len((await theirs.fetch_state())["nodes"]) == 0, "their session untouched"
                assert len((await mine.fetch_state())["nodes"]) == 1

    try:
        asyncio.run(run())
    finally:
        engine.close()


@contextlib.asynccontextmanager
async def proxy_in_process(manager: ServerManager, tokenizer) -> AsyncIterator[str]:
    """`serve_in_process` over `manager`, which then opens its sessions there: its URL."""
    url, task = await serve_in_process(manager, tokenizer, "tiny")
    manager.proxy_url = url
    try:
        yield url
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def keyless_proxy(tokenizer, engine: TokenScriptServer, budget: int = 32768) -> TestClient:
    """A keyless proxy app (upstream's default) served in process, addressed as a local
    client addresses it."""
    manager = ServerManager([server_config(engine.url)])
    app = create_app(manager, tokenizer, "tiny", SessionLimits(session_token_budget=budget))
    return TestClient(app, base_url="http://127.0.0.1")


def test_prx2_a_keyless_proxy_answers_no_rebinding_page_and_no_cross_site_form(tokenizer):
    ids = tokenizer.encode("a b", add_special_tokens=False)
    engine = TokenScriptServer([(ids, "stop")])
    try:
        with keyless_proxy(tokenizer, engine) as http:
            uuid = http.post("/sessions/create", json={}).json()["uuid"]
            assert "api_key" not in http.post("/sessions/create", json={}).json()
            rebound = {"Host": "attacker.example"}
            for path in ("/sessions", f"/{uuid}/nodes", "/servers"):
                seen = http.get(path, headers=rebound)
                assert seen.status_code == 400 and "attacker.example" in seen.json()["detail"]
            form = http.post(
                "/setup",
                content=json.dumps({"servers": [{"base_url": "http://203.0.113.7:8000/v1"}]}),
                headers={"Content-Type": "text/plain"},
            )
            assert form.status_code == 415, form.text
            assert http.get("/servers").json()["servers"][0]["base_url"] == f"{engine.url}/v1"
            assert http.get("/health", headers=rebound).status_code == 200
            assert http.get("/sessions").status_code == 200, "a local client is answered"
    finally:
        engine.close()


def test_prx3_n_and_the_prompt_count_against_the_session_budget(tokenizer):
    """The review's request: budget 60, n=20. Refused before the backend is asked;
    within the budget, n x (prompt + max_tokens) fits what is left."""
    ids = tokenizer.encode("a b c d e f g h", add_special_tokens=False)
    engine = TokenScriptServer([(ids, "length")] * 40)
    try:
        with keyless_proxy(tokenizer, engine, budget=60) as http:
            uuid = http.post("/sessions/create", json={}).json()["uuid"]
            path = f"/{uuid}/v1/chat/completions"
            greedy = http.post(path, json={"messages": HI, "n": 20, "max_tokens": 100})
            assert greedy.status_code == 400 and "budget of 60" in greedy.text, greedy.text
            assert engine.requests == [], "refused before any token was sampled"
            big = [{"role": "user", "content": "word " * 200}]
            assert http.post(path, json={"messages": big}).status_code == 400
            fits = http.post(path, json={"messages": HI, "n": 2, "max_tokens": 100})
            assert fits.status_code == 200, fits.text
            nodes = http.get(f"/{uuid}/nodes").json()["nodes"]
            assert len(nodes) == 2 and sum(len(n["tokens"]) for n in nodes) <= 60
            prompt = len(nodes[0]["tokens"]) - len(ids)
            assert engine.requests[0]["max_tokens"] == 60 // 2 - prompt
    finally:
        engine.close()


def test_a_nested_or_oversized_body_is_refused_before_it_is_parsed(tokenizer):
    """API-A's shape, on the proxy: brackets count as values, and depth is bounded."""
    engine = TokenScriptServer([])
    try:
        with keyless_proxy(tokenizer, engine) as http:
            uuid = http.post("/sessions/create", json={}).json()["uuid"]
            path = f"/{uuid}/v1/chat/completions"
            chunk = "[" * 150 + "]" * 150
            nested = '{"messages": [], "tools": [' + ",".join([chunk] * 8000) + "]}"
            packed = http.post(
                path,
                content=gzip.compress(nested.encode()),
                headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
            )
            assert packed.status_code == 413 and "values" in packed.json()["detail"]
            deep = '{"messages": [], "tools": ' + "[" * 100 + "]" * 100 + "}"
            refused = http.post(path, content=deep, headers={"Content-Type": "application/json"})
            assert refused.status_code == 413 and "nests 101 levels" in refused.json()["detail"]
            quoted = {"messages": [{"role": "user", "content": "[" * 5000}], "max_tokens": 1}
            assert http.post(path, json=quoted).status_code != 413, "text is not structure"
    finally:
        engine.close()


def test_prx5_an_agent_sees_no_backend_address_or_backend_words(tokenizer, caplog):
    engine = TokenScriptServer([])  # every completion refused: "no scripted reply left"
    try:
        with keyless_proxy(tokenizer, engine) as http:
            uuid = http.post("/sessions/create", json={}).json()["uuid"]
            answer = http.post(f"/{uuid}/v1/chat/completions", json={"messages": HI})
            unknown = http.post("/sessions/create", json={"base_url": "http://10.9.9.9/v1"})
        assert answer.status_code == 400, answer.text
        for text in (answer.text, unknown.text):
            assert engine.url.split("//")[1] not in text and "scripted" not in text, text
        assert "no scripted reply left" in caplog.text, "the details go to the log"
    finally:
        engine.close()
