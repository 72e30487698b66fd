"""The ManagedServer proxy: upstream's endpoint shapes, an agent that knows only the
`openai` SDK, nodes equal to an in-process ManagedServer's, and the faults a run meets.

The proxy runs as upstream's `python -m` form over the real CPU engine (tiny model),
or over `TokenScriptServer` where the model must write a tool call (the tiny model
writes noise). The expected shapes are upstream's models (managed_server_proxy.py
of NousResearch/atropos), field by field.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import httpx
import pytest

from atroposlib.envs.scored_data import group_from_chat
from atroposlib.envs.server_handling.managed_server import ManagedServer
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.envs.server_handling.vllm_server import VLLMServer
from atroposlib.utils.ports import free_port
from tests.support.inference_servers import server_config
from tests.support.proxy import ProxyProcess, proxy_config
from tests.support.token_script_server import LOGPROB, TokenScriptServer
from tests.support.tolerances import SAME_LIBRARY_LOGPROB_REL, logprob_tolerance

openai = pytest.importorskip("openai")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.integration

# upstream's response models and dict answers, field by field
SESSION_CREATED = {
    "uuid": str,
    "model_name": str,
    "tool_parser": str,
    "base_url": (str, type(None)),
    "created_at": float,
}
RENDERED = {"prompt_text": str, "token_ids": list, "num_tokens": int}
HEALTH = {"status", "model", "sessions", "servers", "healthy_servers"}
SERVER = {"index", "base_url", "healthy", "model_name", "server_type"}
SESSION = {"uuid", "model_name", "base_url", "created_at", "last_accessed", "num_nodes"}
NODE = {"full_text", "tokens", "masked_tokens", "logprobs", "metadata"}
ERROR = {"message", "type", "code"}
# a small schema: the tiny model's context is 512 tokens, and three turns of a full
# one (descriptions, typed parameters) rendered into the system prompt do not fit
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 5}}\n</tool_call>'
KEY = "sesame"


def assert_fields(body: dict, fields: dict) -> None:
    assert set(body) == set(fields), body
    for name, kind in fields.items():
        assert isinstance(body[name], kind), (name, body[name])


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    return transformers.AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture(scope="module")
def proxy(inference_server, tiny_model_path, tmp_path_factory):
    process = ProxyProcess(
        proxy_config(tiny_model_path, inference_server.url), tmp_path_factory.mktemp("proxy")
    )
    yield process
    process.stop()


@pytest.fixture(scope="module")
def keyed_over_a_dead_backend(tiny_model_path, tmp_path_factory):
    """A proxy that wants KEY, over a backend nobody serves: the key's questions and the
    dead backend's go to one proxy (a proxy process costs about 4 s of CPU)."""
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    process = ProxyProcess(
        proxy_config(tiny_model_path, dead),
        tmp_path_factory.mktemp("keyed-proxy"),
        env={"ATROPOS_PROXY_API_KEY": KEY},
    )
    yield process
    process.stop()


@pytest.fixture
def scripted(tiny_model_path, tmp_path):
    """`scripted(*replies)`: a proxy over a TokenScriptServer giving those replies."""
    made: list = []

    def start(*replies, extra=(), env=None):
        backend = TokenScriptServer(list(replies))
        config = proxy_config(tiny_model_path, backend.url)
        proxy = ProxyProcess(config, tmp_path, *extra, env=env)
        made.extend([backend, proxy])
        return backend, proxy

    yield start
    for thing in made:
        thing.close() if hasattr(thing, "close") else thing.stop()


async def agent(base_url: str, turns: int, max_tokens: int = 6) -> list[dict]:
    """A tool-using agent loop that knows nothing but the `openai` SDK."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages: list[dict] = [
        {"role": "system", "content": "Add numbers with the add tool."},
        {"role": "user", "content": "What is 2 + 5?"},
    ]
    try:
        for _ in range(turns):
            reply = await client.chat.completions.create(
                model="tiny", messages=messages, tools=TOOLS, max_tokens=max_tokens
            )
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls or []:
                arguments = json.loads(call.function.arguments)
                result = str(arguments["a"] + arguments["b"])
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            if not message.tool_calls:
                messages.append({"role": "user", "content": "Use the tool, please."})
    finally:
        await client.close()
    return messages


# ---------------------------------------------------------------- shapes
def test_every_endpoint_answers_with_upstreams_shape(proxy, inference_server):
    backend = f"{inference_server.url}/v1"
    with httpx.Client(base_url=proxy.url, timeout=60) as http:
        health = http.get("/health").json()
        assert set(health) == HEALTH and health["status"] == "ok"
        assert health["servers"] == health["healthy_servers"] == 1
        models = http.get("/v1/models").json()
        assert models["object"] == "list" and models["data"][0]["id"] == "tiny"
        servers = http.get("/servers").json()["servers"]
        assert [set(s) for s in servers] == [SERVER] and servers[0]["base_url"] == backend
        created = http.post("/sessions/create", json={}).json()
        assert_fields(created, SESSION_CREATED)
        assert created["tool_parser"] == "hermes" and created["base_url"] == backend
        uuid = created["uuid"]
        listed = http.get("/sessions").json()["sessions"]
        assert [set(s) for s in listed if s["uuid"] == uuid] == [SESSION]
        request = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 4}
        rendered = http.post(f"/{uuid}/v1/chat/completions/render", json=request).json()
        assert_fields(rendered, RENDERED)
        assert rendered["num_tokens"] == len(rendered["token_ids"])
        answer = http.post(f"/{uuid}/v1/chat/completions", json=request).json()
        assert set(answer) == {"id", "object", "created", "model", "choices"}
        assert answer["object"] == "chat.completion" and answer["model"] == "tiny"
        (choice,) = answer["choices"]
        assert set(choice) == {"index", "message", "finish_reason"}
        assert choice["message"]["role"] == "assistant"
        (node,) = http.get(f"/{uuid}/nodes").json()["nodes"]
        assert set(node) == NODE
        assert node["tokens"][: rendered["num_tokens"]] == rendered["token_ids"]
        assert http.delete(f"/{uuid}").json() == {"status": "deleted", "uuid": uuid}
        for gone in (http.get(f"/{uuid}/nodes"), http.delete(f"/{uuid}")):
            assert gone.status_code == 404 and set(gone.json()["error"]) == ERROR
        setup = {"model_name": "tiny", "servers": [{"base_url": backend}]}
        assert http.post("/setup", json=setup).json() == {
            "status": "ok",
            "servers": 1,
            "model_name": "tiny",
        }
        again = http.post("/sessions/create", json={"base_url": backend}).json()["uuid"]
        assert http.post(f"/{again}/v1/chat/completions", json=request).status_code == 200
        http.delete(f"/{again}")


# ---------------------------------------------------------------- a black-box agent
def test_an_openai_sdk_agent_is_recorded_token_for_token(
    proxy, inference_server, tiny_model_path, tokenizer
):
    """The env side as an upstream env writes it: ServerManager(proxy_url=...), the
    agent handed `managed.get_url()`, the nodes read back into a group."""

    async def rollout():
        manager = ServerManager([server_config(inference_server.url)], proxy_url=proxy.url)
        async with manager.managed_server() as managed:
            assert managed.get_url() == f"{proxy.url}/{managed.session_uuid}/v1"
            # two turns: the hermes tool block alone is 449 of the tiny model's 512 tokens
            messages = await agent(managed.get_url(), turns=2)
            state = await managed.fetch_state()
        return messages, state["nodes"]

    messages, nodes = asyncio.run(rollout())
    assert sum(m["role"] == "assistant" for m in messages) == 2
    assert nodes, "the proxy recorded nothing"
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    trained = 0
    for node in nodes:
        assert len(node.tokens) == len(node.masked_tokens) == len(node.logprobs)
        with torch.no_grad():
            logits = model(torch.tensor([node.tokens])).logits[0].float()
        reference = torch.log_softmax(logits, -1)
        tolerance = logprob_tolerance(logits, SAME_LIBRARY_LOGPROB_REL)
        for position, (token, mask) in enumerate(zip(node.tokens, node.masked_tokens, strict=True)):
            if mask == -100:
                assert node.logprobs[position] == 1.0
                continue
            assert mask == token and position > 0
            expected = reference[position - 1, token].item()
            assert abs(node.logprobs[position] - expected) <= tolerance, position
            trained += 1
    assert trained >= 2, "every assistant turn is trained"
    last = max(nodes, key=lambda n: len(n.tokens))
    assert "Use the tool, please." in last.full_text and "What is 2 + 5?" in last.full_text
    group = group_from_chat(messages[:2], ["x"] * len(nodes), nodes, [1.0] * len(nodes))
    assert group["tokens"] == [n.tokens for n in nodes]
    assert group["inference_logprobs"] == [n.logprobs for n in nodes]


def test_tool_calls_reach_the_sdk_parsed_and_nodes_equal_an_in_process_managed_servers(
    scripted, tokenizer
):
    """The model writes a hermes call: the SDK gets it as `tool_calls`, the node keeps
    the raw text, and the node is the one an in-process ManagedServer records."""
    call_ids = tokenizer.encode(CALL_TEXT, add_special_tokens=False)
    done_ids = tokenizer.encode("7", add_special_tokens=False)
    replies = [(call_ids, "stop"), (done_ids, "stop")]
    backend, proxy = scripted(*replies)

    async def through_the_proxy():
        manager = ServerManager([server_config(backend.url)], proxy_url=proxy.url)
        async with manager.managed_server() as managed:
            messages = await agent(managed.get_url(), turns=2)
            return messages, (await managed.fetch_state())["nodes"]

    messages, nodes = asyncio.run(through_the_proxy())
    call = messages[2]["tool_calls"][0]
    assert call["function"]["name"] == "add"
    assert json.loads(call["function"]["arguments"]) == {"a": 2, "b": 5}
    assert messages[3] == {"role": "tool", "tool_call_id": call["id"], "content": "7"}
    assert CALL_TEXT in nodes[-1].full_text, "the recorded text is what the model wrote"

    # the same agent in process, over the same scripted replies
    backend.replies = list(replies)

    async def in_process():
        server = VLLMServer(server_config(backend.url))
        managed = ManagedServer(server, tokenizer, tool_parser="hermes")
        conversation = list(messages[:2])
        for _ in range(2):
            reply = await managed.chat_completion(
                messages=conversation, tools=TOOLS, max_tokens=6, n=1, temperature=1.0
            )
            message = reply.choices[0].message
            calls = [dict(c) for c in message.tool_calls or []]
            turn = {"role": "assistant", "content": message.content}
            conversation.append({**turn, "tool_calls": calls} if calls else turn)
            for c in calls:
                result = str(sum(json.loads(c["function"]["arguments"]).values()))
                conversation.append({"role": "tool", "tool_call_id": c["id"], "content": result})
        return managed.get_state()["nodes"]

    local = asyncio.run(in_process())
    assert [n.model_dump() for n in nodes] == [n.model_dump() for n in local]
    trained = [
        lp for n in nodes for lp, m in zip(n.logprobs, n.masked_tokens, strict=True) if m != -100
    ]
    assert trained and all(lp == LOGPROB for lp in trained)


# ---------------------------------------------------------------- faults and limits
def test_an_idle_session_expires_and_then_answers_404(scripted):
    _, proxy = scripted(extra=("--idle-timeout-s", "1"))
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        uuid = http.post("/sessions/create", json={}).json()["uuid"]
        assert http.get(f"/{uuid}/nodes").status_code == 200  # a request keeps it alive
        # /health does not touch a session: the reaper alone must drop it
        deadline = time.monotonic() + 30
        while http.get("/health").json()["sessions"]:
            assert time.monotonic() < deadline, "the idle session never expired"
            time.sleep(0.2)
        gone = http.get(f"/{uuid}/nodes")
        assert gone.status_code == 404 and "not found" in gone.json()["error"]["message"]


def test_the_sdk_gets_openai_errors_for_an_unknown_session_and_a_dead_backend(
    keyed_over_a_dead_backend,
):
    proxy = keyed_over_a_dead_backend

    async def ask(uuid: str):
        client = openai.AsyncOpenAI(
            base_url=f"{proxy.url}/{uuid}/v1", api_key=KEY, max_retries=0, timeout=30
        )
        try:
            return await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        finally:
            await client.close()

    with pytest.raises(openai.NotFoundError, match="not found"):
        asyncio.run(ask("no-such-session"))
    keyed = {"Authorization": f"Bearer {KEY}"}
    created = httpx.post(f"{proxy.url}/sessions/create", json={}, headers=keyed, timeout=30)
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as refused:
        asyncio.run(ask(created.json()["uuid"]))
    assert refused.value.status_code == 503 and "cannot be reached" in str(refused.value)
    assert time.monotonic() - started < 20, "a dead backend must not hang the agent"


def test_a_sessions_token_budget_and_the_session_cap_are_enforced(scripted, tokenizer):
    ids = tokenizer.encode("a b c d", add_special_tokens=False)
    backend, proxy = scripted(
        *[(ids, "length")] * 10, extra=("--session-token-budget", "60", "--max-sessions", "2")
    )
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        uuid = http.post("/sessions/create", json={}).json()["uuid"]
        http.post("/sessions/create", json={})
        full = http.post("/sessions/create", json={})
        assert full.status_code == 429 and "--max-sessions" in full.json()["error"]["message"]
        messages = [{"role": "user", "content": "count"}]
        render = f"/{uuid}/v1/chat/completions/render"
        first_prompt = http.post(render, json={"messages": messages}).json()["num_tokens"]
        statuses = []
        for _ in range(10):
            answer = http.post(f"/{uuid}/v1/chat/completions", json={"messages": messages})
            statuses.append(answer.status_code)
            if answer.status_code != 200:
                assert "budget of 60 tokens" in answer.json()["error"]["message"]
                break
            messages += [answer.json()["choices"][0]["message"], {"role": "user", "content": "on"}]
        assert statuses[0] == 200 and statuses[-1] == 400, statuses
        recorded = len(http.get(f"/{uuid}/nodes").json()["nodes"][0]["tokens"])
        assert recorded <= 60, "the session never holds more than its budget"
    # each request's max_tokens was cut to what was left of the budget after its prompt
    asked = [request["max_tokens"] for request in backend.requests]
    assert asked[0] == 60 - first_prompt, "nothing recorded yet: the budget less the prompt"
    assert asked == sorted(asked, reverse=True) and asked[-1] < asked[0]


def test_two_hundred_concurrent_sessions_never_see_each_others_turns(proxy, inference_server):
    async def one(client: httpx.AsyncClient, index: int) -> tuple[int, list[dict]]:
        uuid = (await client.post("/sessions/create", json={})).json()["uuid"]
        request = {
            "messages": [{"role": "user", "content": f"Session {index} says hello."}],
            "max_tokens": 2,
        }
        answer = await client.post(f"/{uuid}/v1/chat/completions", json=request)
        assert answer.status_code == 200, answer.text
        nodes = (await client.get(f"/{uuid}/nodes")).json()["nodes"]
        assert (await client.delete(f"/{uuid}")).status_code == 200
        return index, nodes

    async def all_of_them():
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(base_url=proxy.url, timeout=300, limits=limits) as client:
            return await asyncio.gather(*(one(client, i) for i in range(200)))

    results = asyncio.run(all_of_them())
    assert len(results) == 200
    for index, nodes in results:
        assert len(nodes) == 1
        text = nodes[0]["full_text"]
        assert f"Session {index} says hello." in text
        assert sum(f"Session {k} says" in text for k in range(200)) == 1
    assert httpx.get(f"{proxy.url}/health").json()["sessions"] == 0


# ---------------------------------------------------------------- exposure
def test_the_proxy_wants_its_key_and_refuses_an_open_address_without_one(
    keyed_over_a_dead_backend, tiny_model_path, tmp_path
):
    import subprocess
    import sys

    from tests.support.proxy import PROXY_MODULE

    with httpx.Client(base_url=keyed_over_a_dead_backend.url, timeout=30) as http:
        assert http.get("/health").status_code == 200, "health stays open"
        refused = http.post("/sessions/create", json={})
        assert refused.status_code == 401 and "Bearer" in refused.json()["error"]["message"]
        keyed = {"Authorization": f"Bearer {KEY}"}
        assert http.post("/sessions/create", json={}, headers=keyed).status_code == 200
    config = tmp_path / "servers.json"
    config.write_text(json.dumps(proxy_config(tiny_model_path, "http://127.0.0.1:1")))
    done = subprocess.run(
        [sys.executable, "-m", PROXY_MODULE, "--config", str(config), "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "ATROPOS_PROXY_API_KEY"},
    )
    assert done.returncode == 2 and "refusing to bind 0.0.0.0" in done.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"servers": []}')
    done = subprocess.run(
        [sys.executable, "-m", PROXY_MODULE, "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "model_name" in done.stderr and "Traceback" not in done.stderr


# ---------------------------------------------------------------- served in process
def test_a_proxy_served_in_process_opens_reads_and_deletes_its_own_sessions_by_call(
    tokenizer, tiny_model_path, monkeypatch
):
    """`serve_in_process`: the env's own sessions skip HTTP, the agent's requests do not,
    and what the env reads (nodes, refusals) is what it would read over HTTP."""
    from atroposlib.envs.server_handling import proxy_client
    from atroposlib.envs.server_handling.managed_server_proxy import serve_in_process

    ids = tokenizer.encode("7", add_special_tokens=False)
    backend = TokenScriptServer([(ids, "stop")] * 2)

    async def run() -> None:
        manager = ServerManager([server_config(backend.url)])
        url, task = await serve_in_process(manager, tokenizer, "tiny")
        service = proxy_client.IN_PROCESS_PROXIES[url]
        manager.proxy_url = url
        try:
            async with manager.managed_server(use_proxy=True) as managed:
                assert managed._service is service
                client = openai.AsyncOpenAI(base_url=managed.get_url(), api_key=managed.api_key)
                reply = await client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "3 + 4?"}]
                )
                assert reply.choices[0].message.content == "7"
                nodes = (await managed.fetch_state())["nodes"]
                # the same over HTTP, with the key that never leaves the process
                admin = {"Authorization": f"Bearer {service.api_key}"}
                async with httpx.AsyncClient(base_url=url, headers=admin) as http:
                    over_http = (await http.get(f"/{managed.session_uuid}/nodes")).json()
                assert [n.model_dump() for n in nodes] == over_http["nodes"]
                assert nodes[0].tokens[-len(ids) :] == ids
            assert len(service.sessions) == 0, "the session outlived its block"
            # a deleted session is refused in the words the HTTP route uses
            refusals = []
            for registered in (True, False):
                if not registered:  # as another process holding the proxy's key sees it
                    del proxy_client.IN_PROCESS_PROXIES[url]
                    monkeypatch.setenv(proxy_client.PROXY_KEY_ENVIRONMENT, service.api_key)
                gone = proxy_client.ProxyManagedServer(url, managed.session_uuid)
                assert (gone._service is service) is registered
                with pytest.raises(proxy_client.ProxyError) as refused:
                    await gone.fetch_state()
                refusals.append(str(refused.value))
            assert refusals[0] == refusals[1] and "(404)" in refusals[0], refusals
            proxy_client.IN_PROCESS_PROXIES[url] = service
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert url not in proxy_client.IN_PROCESS_PROXIES, "a stopped proxy stays listed"
        assert len(backend.requests) == 1, "one completion, and nothing else, reached it"

    try:
        asyncio.run(run())
    finally:
        backend.close()
