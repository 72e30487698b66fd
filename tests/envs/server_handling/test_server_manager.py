"""ServerManager and ManagedServer against the real CPU inference server (tiny model)."""

from __future__ import annotations

import asyncio

import pytest

from atroposlib.envs.server_handling.server_manager import (
    APIServerConfig,
    ServerBaseline,
    ServerManager,
    resolve_server_configs,
    slurm_server_configs,
)
from tests.support.inference_servers import QUESTION, server_config
from tests.support.relay import PortRelay
from tests.support.tolerances import SAME_LIBRARY_LOGPROB_REL, logprob_tolerance
from tests.support.waiting import wait_until_async

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_where_servers_come_from():
    one = APIServerConfig(base_url="http://gpu-7:9001/v1", model_name="m")
    assert [c.base_url for c in resolve_server_configs(one)] == ["http://gpu-7:9001/v1"]
    local = resolve_server_configs(ServerBaseline(timeout=7, model_name="m"))
    assert [c.base_url for c in local] == [f"http://localhost:{p}/v1" for p in range(9004, 9008)]
    assert all(c.timeout == 7 and c.api_key == "x" and c.model_name == "m" for c in local)
    many = [APIServerConfig(base_url=f"http://h{i}:1/v1") for i in range(3)]
    assert resolve_server_configs(many) == many


def test_slurm_discovery_from_a_synthetic_job():
    env = {"SLURM_JOB_NODELIST": "node[1-3]", "NUM_TRAINING_NODES": "1", "INFER_TP": "2"}
    configs = slurm_server_configs(
        ServerBaseline(model_name="m"), env, hostnames=lambda _: ["node1", "node2", "node3"]
    )
    assert [c.base_url for c in configs] == [
        f"http://node{n}:{p}/v1" for n in (2, 3) for p in range(9000, 9004)
    ]
    assert all(c.model_name == "m" for c in configs)
    assert slurm_server_configs(ServerBaseline(), env, hostnames=lambda _: ["node1"]) is None
    assert slurm_server_configs(ServerBaseline(), {}, hostnames=lambda _: []) is None


def test_testing_harness_needs_no_network():
    manager = ServerManager(ServerBaseline(), testing=True)
    answer = asyncio.run(manager.chat_completion(messages=QUESTION, n=3))
    assert len(answer.choices) == 3 and answer.choices[0].message.content


def test_chat_with_n_split_across_requests(inference_server):
    manager = ServerManager([server_config(inference_server.url)], max_n_completions=2)

    async def scenario():
        chat = await manager.chat_completion(messages=QUESTION, n=5, max_tokens=4)
        text = await manager.completion(prompt="What is", n=3, max_tokens=3)
        return chat, text

    chat, text = asyncio.run(scenario())
    assert [c.index for c in chat.choices] == [0, 1, 2, 3, 4]
    assert len(text.choices) == 3


def test_dead_server_leaves_rotation_and_returns(inference_server):
    """The dead server comes back as the session's engine behind a relay on its port
    (tests/support/relay.py): a client sees the same as a real engine started there."""
    revived = PortRelay(inference_server.url, start=False)
    dead = server_config(revived.url, num_max_requests_at_once=1024)
    alive = server_config(inference_server.url)
    manager = ServerManager([dead, alive], health_interval_s=0.2)

    async def scenario():
        answers = [await manager.chat_completion(messages=QUESTION, max_tokens=2) for _ in range(3)]
        assert not manager.servers[0].server_healthy and manager.servers[1].server_healthy
        revived.start()
        try:
            await wait_until_async(
                lambda: manager.servers[0].server_healthy,
                10,
                "a server that answers again is not used again",
            )
        finally:
            revived.stop()
        return answers

    assert all(a.choices for a in asyncio.run(scenario()))


def test_managed_server_nodes_align_with_the_model(inference_server, tiny_model_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path)
    manager = ServerManager([server_config(inference_server.url)])

    async def scenario():
        async with manager.managed_server(tokenizer=tokenizer) as managed:
            chat = await managed.chat_completion(
                messages=QUESTION, n=3, max_tokens=5, temperature=1.0
            )
            await managed.completion(prompt="What is 1 + 1", n=2, max_tokens=4, temperature=1.0)
            return chat, managed.get_state()["nodes"]

    chat, nodes = asyncio.run(scenario())
    assert len(chat.choices) == 3 and len(nodes) == 5
    prompt_ids = tokenizer.apply_chat_template(
        QUESTION, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    for node in nodes[:3]:
        completion = node.tokens[len(prompt_ids) :]
        assert node.tokens[: len(prompt_ids)] == prompt_ids
        assert node.masked_tokens == [-100] * len(prompt_ids) + completion
        assert node.logprobs[: len(prompt_ids)] == [1.0] * len(prompt_ids)
        with torch.no_grad():
            logits = model(torch.tensor([node.tokens])).logits[0].float()
        reference = torch.log_softmax(logits, -1)
        tolerance = logprob_tolerance(logits, SAME_LIBRARY_LOGPROB_REL)
        for offset, token in enumerate(completion):
            position = len(prompt_ids) + offset
            assert abs(reference[position - 1, token].item() - node.logprobs[position]) <= tolerance
    assert {c.message.content for c in chat.choices} == {
        tokenizer.decode(n.tokens[len(prompt_ids) :], skip_special_tokens=True) for n in nodes[:3]
    }


def test_managed_server_extends_a_conversation(inference_server, tiny_model_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_path)
    manager = ServerManager([server_config(inference_server.url)])

    async def scenario():
        async with manager.managed_server(tokenizer=tokenizer) as managed:
            first = await managed.chat_completion(messages=QUESTION, max_tokens=4, temperature=0)
            turn_one = managed.get_state()["nodes"][0]
            follow_up = QUESTION + [
                {"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "And 3 + 3 mod 10?"},
            ]
            await managed.chat_completion(messages=follow_up, max_tokens=4, temperature=0)
            return turn_one, managed.get_state()["nodes"]

    turn_one, nodes = asyncio.run(scenario())
    assert len(nodes) == 1, "the second turn extends the first node instead of adding one"
    node = nodes[0]
    assert node.tokens[: len(turn_one.tokens)] == turn_one.tokens
    assert node.masked_tokens[: len(turn_one.tokens)] == turn_one.masked_tokens
    assert node.logprobs[: len(turn_one.tokens)] == turn_one.logprobs
    trained = [t for t in node.masked_tokens if t != -100]
    first_answer = [t for t in turn_one.masked_tokens if t != -100]
    assert trained[: len(first_answer)] == first_answer and len(trained) > len(first_answer)
    assert len(node.tokens) == len(node.masked_tokens) == len(node.logprobs)
