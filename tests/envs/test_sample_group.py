"""`BaseEnv.sample_group`: one chat, `group_size` real samples, scored, as a group."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("transformers")

from atroposlib.envs.base import APIServerConfig
from environments.mod_arithmetic import ModArithmeticEnv, answer_for, question_for


def test_a_group_carries_the_engines_tokens_and_each_samples_score(inference_server):
    config, _ = ModArithmeticEnv.config_init()
    config = config.model_copy(update={"group_size": 6})
    server = APIServerConfig(
        model_name=inference_server.name,
        base_url=f"{inference_server.url}/v1",
        server_type="vllm",
        timeout=60,
    )
    env = ModArithmeticEnv(config, server)
    item = {"a": 3, "b": 4}
    messages = env.messages_for(item)
    seen: list[str] = []

    def score(completion: str) -> float:
        seen.append(completion)
        return 1.0 if completion.strip() == answer_for(3, 4) else 0.25

    group = asyncio.run(env.sample_group(messages, score, max_tokens=4, temperature=1.0))
    assert len(group["tokens"]) == len(group["masks"]) == len(group["scores"]) == 6
    assert len(seen) == 6
    assert group["scores"] == [1.0 if c.strip() == "7" else 0.25 for c in seen]
    for tokens, masks, logprobs, conversation, completion in zip(
        group["tokens"],
        group["masks"],
        group["inference_logprobs"],
        group["messages"],
        seen,
        strict=True,
    ):
        assert len(tokens) == len(masks) == len(logprobs)
        assert conversation[:-1] == messages
        assert conversation[-1] == {"role": "assistant", "content": completion}
        prompt_length = next(i for i, m in enumerate(masks) if m != -100)
        assert question_for(3, 4) in env.tokenizer.decode(tokens[:prompt_length])
        assert masks[prompt_length:] == tokens[prompt_length:]  # the sample is trained on
        assert env.tokenizer.decode(tokens[prompt_length:]).startswith(completion)


def test_an_async_scorer_is_awaited_for_every_sample(inference_server):
    """Scoring that runs code in a sandbox is async; its results land in sample order."""
    config, _ = ModArithmeticEnv.config_init()
    server = APIServerConfig(
        model_name=inference_server.name,
        base_url=f"{inference_server.url}/v1",
        server_type="vllm",
        timeout=60,
    )
    env = ModArithmeticEnv(config.model_copy(update={"group_size": 4}), server)
    seen: list[str] = []

    async def score(completion: str) -> float:
        seen.append(completion)
        position = len(seen)
        await asyncio.sleep(0.01 * (4 - position))  # later samples finish first
        return float(position)

    messages = env.messages_for({"a": 1, "b": 2})
    group = asyncio.run(env.sample_group(messages, score, max_tokens=4))
    assert group["scores"] == [1.0, 2.0, 3.0, 4.0] and len(seen) == 4
