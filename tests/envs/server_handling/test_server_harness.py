"""`ServerHarness` (upstream's scriptable fake) behind `ServerManager(testing=True)`."""

from __future__ import annotations

import asyncio

from atroposlib.envs.server_handling.server_harness import (
    CANNED_TEXT,
    CANNED_TOKENS,
    ServerHarness,
    create_chat_completion,
    create_completion,
)
from atroposlib.envs.server_handling.server_manager import ServerBaseline, ServerManager

HI = [{"role": "user", "content": "hi"}]


def test_testing_manager_answers_what_was_scripted_and_canned_otherwise():
    manager = ServerManager(ServerBaseline(), testing=True)
    harness = manager.servers[0]
    assert isinstance(harness, ServerHarness)
    harness.set_desired_response(
        HI, create_chat_completion(["a", "b"], n=2, finish_reason="length")
    )
    harness.set_desired_completion("2+2=", create_completion("4"))

    async def scenario():
        return (
            await manager.chat_completion(messages=HI, n=2),
            await manager.chat_completion(messages=[{"role": "user", "content": "?"}], n=3),
            await manager.completion(prompt="2+2="),
            await manager.chat_completion(messages=HI, n=16),  # split into parts of 8
        )

    scripted, canned, completion, split = asyncio.run(scenario())
    assert [c.message.content for c in scripted.choices] == ["a", "b"]
    assert [c.finish_reason for c in scripted.choices] == ["length", "length"]
    assert [c.message.content for c in canned.choices] == [CANNED_TEXT] * 3
    assert completion.choices[0].text == "4"
    assert len(split.choices) == 4, "each part gets the scripted answer"
    assert len(harness.response_map[harness.conv_to_dictkey(HI)].choices) == 2, "script intact"


def test_tokens_and_logprobs_are_scriptable_by_prompt():
    harness = ServerHarness()
    harness.set_tokens_and_logprobs_response("Hello", [1, 2], [[3, 4]], [[-0.1, -0.2]], ["stop"])

    async def scenario():
        return (
            await harness.tokens_and_logprobs_completion(prompt="Hello", input_ids=[1, 2]),
            await harness.tokens_and_logprobs_completion(prompt="other", input_ids=[9], n=2),
        )

    scripted, canned = asyncio.run(scenario())
    assert scripted == ([1, 2], [[3, 4]], [[-0.1, -0.2]], ["stop"])
    assert canned[0] == [9] and canned[1] == [CANNED_TOKENS, CANNED_TOKENS]
    assert canned[3] == ["stop", "stop"]


def test_harness_takes_upstream_test_attributes():
    harness = ServerHarness()

    class Config:
        model_name = "test_model"

    harness.config = Config()
    harness.tokenizer = "a tokenizer"
    answer = asyncio.run(harness.chat_completion(messages=HI))
    assert answer.model == "test_model" and harness.tokenizer == "a tokenizer"
    assert harness.conv_to_dictkey(HI) == "role:user\ncontent:hi"
    asyncio.run(harness.update_weight(0.5))
    assert harness.sem.min_val() == harness.sem.max_val * 0.5
