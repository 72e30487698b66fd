"""A seeded request split into several (n above max_n_completions, or a server that ignores n)
must not send one seed to every part: each part would draw the same samples."""

from __future__ import annotations

import asyncio

from atroposlib.envs.server_handling.openai_server import OpenAIServer
from atroposlib.envs.server_handling.server_manager import ServerManager
from tests.support.inference_servers import server_config

# High temperature and no EOS: eight tokens each, so two parts that share a seed are equal
# and two with different seeds differ.
SAMPLING = dict(max_tokens=8, temperature=2.0, extra_body={"ignore_eos": True})


def test_split_n_gives_each_part_its_own_seed(inference_server):
    manager = ServerManager([server_config(inference_server.url)], max_n_completions=2)

    async def scenario():
        tokens = await manager.tokens_and_logprobs_completion(
            prompt=[10, 11, 12], n=4, seed=1234, **SAMPLING
        )
        chat = await manager.completion(prompt="What is", n=4, seed=1234, **SAMPLING)
        tokens_again = await manager.tokens_and_logprobs_completion(
            prompt=[10, 11, 12], n=4, seed=1234, **SAMPLING
        )
        return tokens[1], [c.text for c in chat.choices], tokens_again[1]

    outputs, texts, outputs_again = asyncio.run(scenario())
    assert outputs[:2] != outputs[2:], "both parts sampled with the same seed"
    assert texts[:2] != texts[2:], "both parts sampled with the same seed"
    assert outputs_again == outputs, "the parts' seeds follow from the request's seed"


def test_fan_out_for_servers_that_ignore_n_gives_each_request_its_own_seed(inference_server):
    config = server_config(inference_server.url, n_kwarg_is_ignored=True)
    server = OpenAIServer(config)

    async def scenario():
        first = await server.completion(prompt="What is", n=3, seed=99, **SAMPLING)
        second = await server.completion(prompt="What is", n=3, seed=99, **SAMPLING)
        return [c.text for c in first.choices], [c.text for c in second.choices]

    first, second = asyncio.run(scenario())
    assert len(set(first)) == 3, f"the n=1 requests repeated one sample: {first!r}"
    assert second == first, "deterministic from the request's seed"


def test_unseeded_split_requests_carry_no_seed(inference_server):
    manager = ServerManager([server_config(inference_server.url)], max_n_completions=2)
    sent: list[dict] = []
    server = manager.servers[0]
    original = server.completion

    async def spy(**kwargs):
        sent.append(dict(kwargs))
        return await original(**kwargs)

    server.completion = spy
    asyncio.run(manager.completion(prompt="What is", n=3, max_tokens=1))
    assert [k.get("n") for k in sent] == [2, 1]
    assert all("seed" not in k for k in sent)
