"""Upstream's configs and constructor arguments: server types, proxy options, weights.

SGLang and TRL's vLLM server cannot run here, so stand-in HTTP servers answer in their
documented shapes and record what the clients send.
"""

from __future__ import annotations

import asyncio

import pytest

from atroposlib.envs.server_handling.openai_server import OpenAIServer
from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    AsyncSemWithAdaptiveWeight,
)
from atroposlib.envs.server_handling.server_manager import ServerManager, ServerManagerConfig
from atroposlib.envs.server_handling.sglang_server import SGLangServer
from atroposlib.envs.server_handling.trl_vllm_server import TrlVllmServer
from atroposlib.envs.server_handling.vllm_server import VLLMServer
from tests.support.inference_servers import ScriptedServer


def test_each_server_type_gets_its_client_and_abstract_class_means_by_type():
    kinds = {"openai": OpenAIServer, "vllm": VLLMServer, "sglang": SGLangServer}
    kinds["trl"] = TrlVllmServer
    configs = [
        APIServerConfig(base_url=f"http://h{i}:1/v1", server_type=k) for i, k in enumerate(kinds)
    ]
    for server_class in (None, APIServer):
        manager = ServerManager(configs, server_class=server_class)
        assert [type(s) for s in manager.servers] == list(kinds.values())


def test_upstream_manager_arguments_and_config_fields(monkeypatch):
    monkeypatch.delenv("ATROPOS_PROXY_URL", raising=False)
    assert ServerManagerConfig(proxy_url="http://p:9100").proxy_url == "http://p:9100"
    assert ServerManagerConfig().max_n_completions == 8
    config = APIServerConfig(base_url=None, model_name="gpt-4.1-nano", api_key="sk-test")
    manager = ServerManager([config], tool_parser="hermes", use_proxy=False)
    assert manager.tool_parser == "hermes" and not manager.use_proxy
    server = manager.servers[0]
    assert server.endpoint_url == "https://api.openai.com/v1"
    assert str(server.openai.base_url).startswith("https://api.openai.com/v1")
    assert manager._get_server_base_url() is None
    proxied = ServerManager([config], proxy_url="http://127.0.0.1:9100")
    assert proxied.use_proxy and proxied.proxy_url == "http://127.0.0.1:9100"
    monkeypatch.setenv("ATROPOS_PROXY_URL", "http://127.0.0.1:9200")
    assert ServerManager([config]).proxy_url == "http://127.0.0.1:9200"

    async def open_proxied():
        async with manager.managed_server(use_proxy=True):
            pass

    with pytest.raises(ValueError, match="requires proxy_url or the ATROPOS_PROXY_URL"):
        asyncio.run(open_proxied())


def test_sglang_token_calls_use_native_generate(standin):
    answer = [
        {
            "meta_info": {
                "output_token_logprobs": [[-0.1, 7, None], [-0.2, 8, None]],
                "finish_reason": {"type": "length", "length": 2},
            }
        },
        {
            "meta_info": {
                "output_token_logprobs": [[-0.3, 9, None]],
                "finish_reason": {"type": "stop"},
            }
        },
    ]
    fake = standin({"/generate": lambda body: answer})
    server = SGLangServer(APIServerConfig(base_url=f"{fake.url}/v1", server_type="sglang"))
    result = asyncio.run(
        server.tokens_and_logprobs_completion(prompt=[1, 2, 3], n=2, max_tokens=2, top_k=5)
    )
    assert result == ([1, 2, 3], [[7, 8], [9]], [[-0.1, -0.2], [-0.3]], ["length", "stop"])
    path, body = fake.requests[-1]
    assert path == "/generate" and body["input_ids"] == [1, 2, 3]
    assert body["sampling_params"] == {"n": 2, "max_new_tokens": 2, "top_k": 5}
    assert body["return_logprob"] is True


def test_trl_chat_renders_the_template_and_decodes(standin, tiny_model_path):
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_path)
    said = tokenizer.encode("hello", add_special_tokens=False)
    fake = standin(
        {"/generate/": lambda body: {"completion_ids": [said, said + [tokenizer.eos_token_id]]}}
    )
    config = APIServerConfig(base_url=fake.url, model_name=str(tiny_model_path), server_type="trl")
    server = TrlVllmServer(config)
    messages = [{"role": "user", "content": "hi"}]
    chat = asyncio.run(server.chat_completion(messages=messages, n=2, temperature=0.5))
    assert [c.finish_reason for c in chat.choices] == ["length", "stop"]
    assert chat.choices[0].message.content == tokenizer.decode(said)
    _, body = fake.requests[-1]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert body["prompts"] == [rendered] and body["n"] == 2 and body["temperature"] == 0.5
    assert body["max_tokens"] == 1024
    with pytest.raises(NotImplementedError, match="vllm"):
        asyncio.run(server.tokens_and_logprobs_completion(prompt=[1]))


@pytest.mark.integration
def test_a_server_found_to_ignore_n_gets_the_rest_one_by_one():
    fake = ScriptedServer([])  # always one choice
    try:
        server = OpenAIServer(APIServerConfig(base_url=fake.url, model_name="m"))
        with pytest.warns(UserWarning, match="ignores the n kwarg"):
            answer = asyncio.run(server.chat_completion(messages=[], n=3))
        assert len(answer.choices) == 3 and fake.requests == 3
        assert server.config.n_kwarg_is_ignored
    finally:
        fake.close()


def test_weight_holds_back_a_share_of_the_slots():
    async def scenario():
        sem = AsyncSemWithAdaptiveWeight(4)
        sem.update_weight(0.5)
        await sem.acquire()
        await sem.acquire()
        third = asyncio.ensure_future(sem.acquire())
        await asyncio.sleep(0)
        held_back = not third.done()
        sem.update_weight(1.0)
        await asyncio.wait_for(third, 5)
        return held_back, sem._value

    assert asyncio.run(scenario()) == (True, 1)


def completion_answer(finish_reason: str) -> dict:
    def choice(index: int, ids: list[int]) -> dict:
        return {
            "index": index,
            "text": "",
            "finish_reason": finish_reason,
            "logprobs": {
                "tokens": [f"token_id:{t}" for t in ids],
                "token_logprobs": [-0.5] * len(ids),
                "top_logprobs": None,
                "text_offset": [0] * len(ids),
            },
            "weight_versions": [{"version": "3", "start": 0, "end": len(ids)}],
        }

    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "tiny",
        "choices": [choice(0, [7, 8]), choice(1, [9])],
    }


@pytest.mark.parametrize("finish_reason", ["length", "abort"])  # abort: not in the SDK's types
def test_vllm_token_calls_post_the_body_as_built(standin, finish_reason):
    """The body goes as built (no per-argument transform); request options stay out of it."""
    fake = standin({"/v1/completions": lambda body: completion_answer(finish_reason)})
    server = VLLMServer(APIServerConfig(base_url=f"{fake.url}/v1", server_type="vllm"))
    prompt, outputs, logprobs, finish = asyncio.run(
        server.tokens_and_logprobs_completion(
            prompt=[1, 2, 3], n=2, max_tokens=2, top_k=5, timeout=30, extra_headers={"X-A": "b"}
        )
    )
    assert (prompt, outputs, logprobs) == ([1, 2, 3], [[7, 8], [9]], [[-0.5, -0.5], [-0.5]])
    assert [str(f) for f in finish] == [finish_reason] * 2
    assert [f.weight_version for f in finish] == ["3", "3"]
    path, body = fake.requests[-1]
    assert path == "/v1/completions"
    assert body == {
        "model": "default",
        "prompt": [1, 2, 3],
        "n": 2,
        "max_tokens": 2,
        "logprobs": 0,
        "top_k": 5,
        "return_tokens_as_token_ids": True,
    }
