"""ManagedServer and VLLMServer token calls against the real CPU inference server.

Findings S1-S4 of the correctness review, aligned with upstream: concurrent branches of
one node, chat-style kwargs, BOS on fresh prompts, and the tokenizer a managed server derives.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from atroposlib.envs.server_handling.managed_server import ManagedServer
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.envs.server_handling.vllm_server import VLLMServer
from tests.support.inference_servers import QUESTION, server_config

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

BOS = "<|endoftext|>"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    return transformers.AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture(scope="module")
def bos_tokenizer_dir(tiny_model_path, tmp_path_factory) -> Path:
    """The tiny tokenizer made Llama-like: encoding adds a BOS, the chat template writes one.

    The tiny model's own tokenizer adds no BOS, so the BOS cases are checked with this
    local variant (nothing can be downloaded here). The model still serves it: BOS is
    one of its special tokens.
    """
    tok = transformers.AutoTokenizer.from_pretrained(tiny_model_path)
    tok.bos_token = BOS
    bos_id = tok.convert_tokens_to_ids(BOS)
    tok.backend_tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    tok.chat_template = "{{ bos_token }}" + tok.chat_template
    folder = tmp_path_factory.mktemp("bos-tokenizer")
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def bos_tokenizer(bos_tokenizer_dir):
    tok = transformers.AutoTokenizer.from_pretrained(bos_tokenizer_dir)
    assert tok("What is")["input_ids"][0] == tok.bos_token_id, "the variant must add a BOS"
    return tok


def test_s1_concurrent_turns_that_extend_one_node_are_both_recorded(inference_server, tokenizer):
    manager = ServerManager([server_config(inference_server.url)])

    async def scenario():
        async with manager.managed_server(tokenizer=tokenizer) as managed:
            first = await managed.chat_completion(messages=QUESTION, max_tokens=4, temperature=0)
            turn_one = managed.get_state()["nodes"][0]
            answer = {"role": "assistant", "content": first.choices[0].message.content}
            history = [*QUESTION, answer]
            branches = [
                history + [{"role": "user", "content": f"And {a} + 3 mod 10?"}] for a in (1, 2)
            ]
            answers = await asyncio.gather(
                *(
                    managed.chat_completion(messages=branch, max_tokens=4, temperature=0)
                    for branch in branches
                ),
                return_exceptions=True,
            )
            return turn_one, answers, managed.get_state()["nodes"]

    turn_one, answers, nodes = asyncio.run(scenario())
    failures = [a for a in answers if isinstance(a, BaseException)]
    assert not failures, f"a concurrent branch failed: {failures!r}"
    assert len(nodes) == 2, "each branch replaces or joins the parent node, none is lost"
    assert {n.full_text.count("And 1 + 3") for n in nodes} == {0, 1}
    for node in nodes:
        assert node.tokens[: len(turn_one.tokens)] == turn_one.tokens
        assert node.masked_tokens[: len(turn_one.tokens)] == turn_one.masked_tokens
        assert len(node.tokens) == len(node.masked_tokens) == len(node.logprobs)


def test_s1_an_extended_node_keeps_its_place_in_the_list(inference_server, tokenizer):
    manager = ServerManager([server_config(inference_server.url)])

    async def scenario():
        async with manager.managed_server(tokenizer=tokenizer) as managed:
            await managed.completion(prompt="What is 1", max_tokens=2, temperature=0)
            await managed.completion(prompt="What is 2", max_tokens=2, temperature=0)
            first = managed.get_state()["nodes"][0]
            await managed.completion(prompt=first.full_text + " and", n=2, max_tokens=2)
            return first, managed.get_state()["nodes"]

    first, nodes = asyncio.run(scenario())
    assert len(nodes) == 3
    assert nodes[0].full_text.startswith(first.full_text + " and"), "replaced in place"
    assert nodes[1].full_text.startswith("What is 2")
    assert nodes[2].full_text.startswith(first.full_text + " and"), "further samples appended"


@pytest.mark.parametrize("alias", ["max_completion_tokens", "max_new_tokens"])
def test_s2_max_token_aliases_limit_the_completion(inference_server, tokenizer, alias):
    manager = ServerManager([server_config(inference_server.url)])

    async def scenario():
        async with manager.managed_server(tokenizer=tokenizer) as managed:
            chat = await managed.chat_completion(
                messages=QUESTION, n=2, extra_body={"ignore_eos": True}, **{alias: 3}
            )
            return chat, managed.get_state()["nodes"]

    chat, nodes = asyncio.run(scenario())
    assert [c.finish_reason for c in chat.choices] == ["length", "length"]
    assert [sum(t != -100 for t in n.masked_tokens) for n in nodes] == [3, 3]


def test_s2_tools_are_dropped_with_a_warning_and_vllm_sampling_kwargs_pass(
    inference_server, tokenizer, caplog, monkeypatch
):
    caplog.set_level(logging.WARNING, logger="atroposlib.inference")
    monkeypatch.setattr(ManagedServer, "warned_about_tools", False)
    manager = ServerManager([server_config(inference_server.url)])
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]

    async def scenario():
        async with manager.managed_server(tokenizer=tokenizer) as managed:
            chat = await managed.chat_completion(
                messages=QUESTION,
                max_tokens=2,
                tools=tools,
                tool_choice="auto",
                top_k=5,
                ignore_eos=True,
            )
            return chat, managed.get_state()["nodes"]

    chat, nodes = asyncio.run(scenario())
    rendered = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    assert nodes[0].full_text.startswith(rendered), "the prompt is rendered without the tools"
    assert chat.choices[0].finish_reason == "length", "ignore_eos reached the engine"
    assert any("tool" in r.getMessage() for r in caplog.records), "dropping tools is logged"


def test_s3_fresh_completion_prompts_start_with_one_bos(inference_server, bos_tokenizer):
    manager = ServerManager([server_config(inference_server.url)])
    bos = bos_tokenizer.bos_token_id

    async def scenario():
        async with manager.managed_server(tokenizer=bos_tokenizer) as managed:
            await managed.completion(prompt="What is 1 + 1", max_tokens=2)
            await managed.completion(prompt=BOS + "What is 3 + 3", max_tokens=2)
            await managed.chat_completion(messages=QUESTION, max_tokens=2)
            return managed.get_state()["nodes"]

    nodes = asyncio.run(scenario())
    assert [n.tokens[0] for n in nodes] == [bos] * 3, "fresh prompts begin with BOS"
    assert [n.tokens[1] for n in nodes].count(bos) == 0, "never a doubled BOS"
    plain = bos_tokenizer("What is 1 + 1")["input_ids"]
    assert nodes[0].tokens[: len(plain)] == plain


def test_s4_managed_server_derives_the_tokenizer(inference_server, tiny_model_path, tokenizer):
    config = server_config(inference_server.url, tokenizer_name=str(tiny_model_path))
    manager = ServerManager([config])

    async def scenario():
        async with manager.managed_server() as managed:
            await managed.chat_completion(messages=QUESTION, max_tokens=2)
            return managed.get_state()["nodes"]

    nodes = asyncio.run(scenario())
    prompt_ids = tokenizer.apply_chat_template(
        QUESTION, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    assert nodes[0].tokens[: len(prompt_ids)] == prompt_ids


def test_s4_text_prompts_are_tokenized_by_the_vllm_client(inference_server, bos_tokenizer_dir):
    tok = transformers.AutoTokenizer.from_pretrained(bos_tokenizer_dir)
    server = VLLMServer(server_config(inference_server.url, tokenizer_name=str(bos_tokenizer_dir)))

    async def scenario():
        plain = await server.tokens_and_logprobs_completion(prompt="What is 2", max_new_tokens=2)
        prefixed = await server.tokens_and_logprobs_completion(
            prompt=BOS + "What is 2", max_tokens=2
        )
        return plain, prefixed

    (plain_ids, outputs, logprobs, finishes), (prefixed_ids, *_) = asyncio.run(scenario())
    assert plain_ids == tok("What is 2")["input_ids"]
    assert prefixed_ids == plain_ids, "a doubled BOS is dropped"
    assert len(outputs) == len(logprobs) == len(finishes) == 1
    assert len(outputs[0]) == len(logprobs[0]) <= 2


def test_s4_a_tokenizer_that_cannot_be_loaded_is_a_clear_error(inference_server, tmp_path):
    missing = tmp_path / "no-tokenizer-here"
    manager = ServerManager([server_config(inference_server.url, tokenizer_name=str(missing))])

    async def scenario():
        async with manager.managed_server():
            pass

    with pytest.raises(ValueError, match="tokenizer"):
        asyncio.run(scenario())
