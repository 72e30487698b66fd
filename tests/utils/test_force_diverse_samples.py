"""generate_with_diverse_first_tokens against the real CPU inference server and tiny model."""

from __future__ import annotations

import math
import random
from collections import Counter
from types import SimpleNamespace

import pytest

from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.utils.force_diverse_samples import (
    _draw_distinct,
    generate_with_diverse_first_tokens,
)
from tests.support.inference_servers import QUESTION, server_config


class Env:
    """The parts of an environment the function reads: `server` and `fallback_generate`."""

    def __init__(self, server) -> None:
        self.server = server
        self.fallback_calls: list[tuple] = []

    async def fallback_generate(self, messages, prefill, n, max_tokens, temperature):
        self.fallback_calls.append((messages, prefill, n, max_tokens, temperature))
        return ["fallback"] * n


async def first_token_candidates(manager: ServerManager) -> list[tuple[str, float]]:
    probe = await manager.chat_completion(
        messages=[*QUESTION, {"role": "assistant", "content": ""}],
        n=1,
        max_tokens=1,
        temperature=0.0,
        logprobs=True,
        top_logprobs=20,
    )
    return [(i.token, i.logprob) for i in probe.choices[0].logprobs.content[0].top_logprobs]


async def test_completions_start_with_distinct_sampled_first_tokens(inference_server):
    manager = ServerManager([server_config(inference_server.url)])
    env = Env(manager)
    candidates = await first_token_candidates(manager)
    assert len(candidates) == 20
    random.seed(3)
    expected = [candidates[i][0] for i in _draw_distinct([lp for _, lp in candidates], 4, 1.0)]
    assert len(set(expected)) == 4

    random.seed(3)
    completions = await generate_with_diverse_first_tokens(
        env, QUESTION, n=4, max_tokens=4, temperature=1.0
    )

    assert len(completions) == 4
    for completion, token in zip(completions, expected, strict=True):
        assert completion.startswith(token) and len(completion) > len(token)
    assert env.fallback_calls == []


def test_draws_are_distinct_and_follow_the_probabilities():
    logprobs = [math.log(0.7), math.log(0.2), math.log(0.1)]
    random.seed(0)
    firsts = Counter(_draw_distinct(logprobs, 2, 1.0)[0] for _ in range(2000))
    assert firsts[0] > firsts[1] > firsts[2] > 0
    assert all(sorted(_draw_distinct(logprobs, 5, 1.0)) == [0, 1, 2] for _ in range(20))
    cold = Counter(_draw_distinct(logprobs, 1, 0.1)[0] for _ in range(500))
    assert cold[0] > 490, "a low temperature should almost always take the most likely token"


async def test_greedy_temperature_takes_the_most_likely_first_tokens(inference_server):
    manager = ServerManager([server_config(inference_server.url)])
    candidates = await first_token_candidates(manager)
    completions = await generate_with_diverse_first_tokens(
        Env(manager), QUESTION, n=3, max_tokens=2, temperature=0.0
    )
    top = [token for token, _ in candidates[:3]]
    assert [c[: len(t)] for c, t in zip(completions, top, strict=True)] == top


class NoLogprobsServer:
    """A server whose chat answers carry no logprobs (some hosted APIs)."""

    def __init__(self) -> None:
        self.calls = 0

    async def chat_completion(self, **kwargs):
        self.calls += 1
        return SimpleNamespace(choices=[SimpleNamespace(logprobs=None)])


async def test_without_logprobs_the_environment_fallback_is_used():
    env = Env(NoLogprobsServer())
    result = await generate_with_diverse_first_tokens(env, QUESTION, prefill="Answer:", n=2)
    assert result == ["fallback", "fallback"]
    assert env.fallback_calls == [(QUESTION, "Answer:", 2, 4096, 1.0)]


async def test_without_logprobs_or_fallback_the_error_says_so():
    env = SimpleNamespace(server=NoLogprobsServer())
    with pytest.raises(RuntimeError, match="no fallback_generate"):
        await generate_with_diverse_first_tokens(env, QUESTION, n=2)
