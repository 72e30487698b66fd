"""Upstream's ManagedServer surface: SequenceNode as a model, get_logprobs, tree mode,
ManagedServerAdapter and DummyManagedServer, against real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import types
import warnings

import pytest

from atroposlib.envs.server_handling.managed_server import (
    DummyManagedServer,
    ManagedServer,
    ManagedServerAdapter,
    SequenceNode,
)
from atroposlib.envs.server_handling.openai_server import OpenAIServer
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.envs.server_handling.vllm_server import VLLMServer
from tests.support.inference_servers import QUESTION, server_config
from tests.support.policy_server import PolicyChatServer

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    return transformers.AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture
def chat_server():
    server = PolicyChatServer(lambda messages, n: [f"reply {i}" for i in range(n)])
    yield server
    server.close()


def test_sequence_nodes_dump_copy_and_rebuild(inference_server, tokenizer):
    managed = ManagedServer(VLLMServer(server_config(inference_server.url)), tokenizer)
    asyncio.run(managed.completion(prompt="What is 1", max_tokens=2))
    node = managed.get_state()["nodes"][0]

    dumped = node.model_dump()
    assert set(dumped) == {"full_text", "tokens", "masked_tokens", "logprobs", "metadata"}
    assert SequenceNode(**dumped) == node, "a node survives a JSON-style round trip"
    assert SequenceNode.model_validate_json(node.model_dump_json()) == node
    copy = node.model_copy(update={"metadata": {"score": 1.0}})
    assert copy.tokens == node.tokens and copy.metadata == {"score": 1.0}
    assert node.metadata["finish_reason"] in ("stop", "length")
    with pytest.raises(ValueError):
        SequenceNode(full_text="x", tokens=["not an id"], masked_tokens=[], logprobs=[])


def test_get_logprobs_renders_messages_and_asks_the_server(
    inference_server, tokenizer, tiny_model_path
):
    server = VLLMServer(server_config(inference_server.url, tokenizer_name=str(tiny_model_path)))
    managed = ManagedServer(server, tokenizer)

    payload = asyncio.run(managed.get_logprobs(messages=QUESTION, top_k=2))
    prompt = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    assert payload["prompt_tokens"] == tokenizer(prompt)["input_ids"]
    assert len(payload["prompt_topk_logprobs"]) == len(payload["prompt_tokens"])
    # top 2, plus the prompt token itself where it is not among them (as vLLM)
    assert all(2 <= len(top) <= 3 for top in payload["prompt_topk_token_ids"][1:])


def test_get_logprobs_without_backend_support_is_a_clear_error(tokenizer):
    bare = types.SimpleNamespace(config=types.SimpleNamespace(model_name="m"))
    managed = ManagedServer(bare, tokenizer)
    with pytest.raises(NotImplementedError, match="does not implement get_logprobs"):
        asyncio.run(managed.get_logprobs(prompt="hi"))


def test_tree_mode_keys_nodes_by_text_and_continues_exact_matches(inference_server, tokenizer):
    managed = ManagedServer(
        VLLMServer(server_config(inference_server.url)), tokenizer, track_tree=True
    )

    async def scenario():
        await managed.completion(prompt="What is 1", max_tokens=2, temperature=0)
        (first,) = managed.get_state()["sequences"].values()
        await managed.completion(prompt=first.full_text, max_tokens=2, temperature=0)
        return first, managed.get_state()

    first, state = asyncio.run(scenario())
    assert set(state) == {"sequences", "tree"} and state["tree"] == state["sequences"]
    assert len(state["sequences"]) == 2
    second = state["sequences"][max(state["sequences"], key=len)]
    assert second.tokens[: len(first.tokens)] == first.tokens, "continued from the parent"
    assert second.masked_tokens[: len(first.tokens)] == [-100] * len(first.tokens)
    assert all(text == node.full_text for text, node in state["sequences"].items())


def test_adapter_routes_openai_client_calls_through_the_managed_server(inference_server, tokenizer):
    manager = ServerManager([server_config(inference_server.url)])

    async def scenario():
        async with manager.managed_server(tokenizer=tokenizer) as managed:
            client = ManagedServerAdapter(managed_server=managed, base_url=inference_server.url)
            chat = await client.chat.completions.create(
                model="tiny", messages=QUESTION, max_completion_tokens=2, temperature=1.0
            )
            text = await client.completions.create(model="tiny", prompt="What is", max_tokens=2)
            with pytest.raises(NotImplementedError, match="post"):
                await client.post("/generate", body={}, cast_to=dict)
            with pytest.raises(NotImplementedError):
                client.copy()
            return client, chat, text, managed.get_state()["nodes"]

    client, chat, text, nodes = asyncio.run(scenario())
    assert client.base_url == inference_server.url
    assert chat.choices[0].message.role == "assistant" and text.choices[0].text is not None
    assert len(nodes) == 2, "both client calls were tracked"
    assert sum(t != -100 for t in nodes[0].masked_tokens) <= 2


@pytest.mark.integration
def test_dummy_managed_server_records_placeholder_nodes(chat_server):
    managed = DummyManagedServer(OpenAIServer(server_config(chat_server.url[:-3])))

    chat = asyncio.run(managed.chat_completion(messages=QUESTION, n=2, model="policy"))
    assert [c.message.content for c in chat.choices] == ["reply 0", "reply 1"]
    nodes = managed.get_state()["nodes"]
    assert [n.full_text.rsplit("assistant:", 1)[1] for n in nodes] == ["reply 0", "reply 1"]
    assert nodes[0].full_text.startswith("system:Answer with one digit.\n\nuser:")
    assert all(n.metadata == {"finish_reason": "stop", "dummy_tokens": True} for n in nodes)
    assert nodes[0].masked_tokens[0] == -100 and len(nodes[0].tokens) == 128
    with pytest.raises(NotImplementedError, match="get_logprobs"):
        asyncio.run(managed.get_logprobs(prompt="x"))
    managed.reset()
    assert managed.get_state() == {"nodes": []}


@pytest.mark.integration
@pytest.mark.parametrize("allowed", [False, True])
def test_text_only_endpoints_need_the_dummy_opt_in(chat_server, monkeypatch, allowed):
    if allowed:
        monkeypatch.setenv("ATROPOS_ALLOW_DUMMY_MANAGED_SERVER", "1")
    else:
        monkeypatch.delenv("ATROPOS_ALLOW_DUMMY_MANAGED_SERVER", raising=False)
    manager = ServerManager([server_config(chat_server.url[:-3], server_type="openai")])

    async def scenario():
        async with manager.managed_server() as managed:
            await managed.chat_completion(messages=QUESTION, model="policy")
            return type(managed), managed.get_state()["nodes"]

    if not allowed:
        with pytest.raises(NotImplementedError, match="ATROPOS_ALLOW_DUMMY_MANAGED_SERVER"):
            asyncio.run(scenario())
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kind, nodes = asyncio.run(scenario())
    assert kind is DummyManagedServer and len(nodes) == 1
    assert any("NOT suitable for training" in str(w.message) for w in caught)
