"""Text reversal: the shipped sample, exact and partial credit, and the hub path."""

from __future__ import annotations

import asyncio
import sys
import types

from environments.text_reversal_environment import TextReversalEnv
from tests.support.library_envs import chat_flags, evaluate_files, process_groups
from tests.support.policy_server import policy_fixture
from tests.support.scripted_model import last_turn, scripted_model_fixture


def policy(prompt: str, n: int) -> list[str]:
    text = last_turn(prompt)
    replies = [
        f"<think>from the end</think><reversed_text>{text[::-1]}</reversed_text>",
        f"<reversed_text>{text[::-1][:-3]}</reversed_text>",  # a near miss
        text[::-1],  # right but untagged
        f"<think><reversed_text>{text[::-1]}</reversed_text></think>",
    ]
    return replies[:n]


scripted = scripted_model_fixture(policy)
exact_chat = policy_fixture(
    lambda messages, n: [f"<reversed_text>{messages[-1]['content'][::-1]}</reversed_text>"] * n
)


def test_process_scores_exact_partial_and_untagged(scripted, tiny_model_path, tmp_path):
    groups = process_groups(
        "text_reversal_environment.py",
        tmp_path,
        tiny_model_path,
        scripted.flags(),
        *("--env.max_tokens", "200", "--env.max_token_length", "512"),
    )
    for group in groups:
        exact, near, untagged, hidden = group["scores"]
        assert exact == 1.0 and 0.4 < near < 0.5 and untagged == hidden == 0.0


def test_evaluate_on_the_test_split(exact_chat, tiny_model_path, tmp_path):
    metrics, samples = evaluate_files(
        "text_reversal_environment.py", tmp_path, tiny_model_path, chat_flags(exact_chat.url)
    )
    assert metrics["results"]["all"]["eval/accuracy"] == 1.0 and len(samples) == 12
    assert all(s["gold"] == s["text"][::-1] for s in samples)


def test_the_hub_path_reads_upstreams_dataset(monkeypatch, tiny_model_path):
    calls = []

    def load_dataset(name, subset=None, split=None):
        calls.append((name, subset, split))
        return [{"text": f"{split} row"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    config, servers = TextReversalEnv.config_init()
    update = {"data_source": "hub", "tokenizer_name": str(tiny_model_path)}
    env = TextReversalEnv(config.model_copy(update=update), servers, testing=True)
    asyncio.run(env.setup())
    assert calls == [
        ("NousResearch/TextReversalDataset", None, "train"),
        ("NousResearch/TextReversalDataset", None, "test"),
    ]
    assert env.eval_items == [{"text": "test row"}]
