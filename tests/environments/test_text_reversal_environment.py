"""Text reversal: the hub path, and its rows of the env table (the shipped sample, exact and
partial credit: tests/environments/test_env_table.py)."""

from __future__ import annotations

import asyncio
import sys
import types

from environments.text_reversal_environment import TextReversalEnv
from tests.support.env_table import EvaluateRow, ProcessRow, Run, chat, scripted
from tests.support.scripted_model import last_turn


def policy(prompt: str, n: int) -> list[str]:
    text = last_turn(prompt)
    replies = [
        f"<think>from the end</think><reversed_text>{text[::-1]}</reversed_text>",
        f"<reversed_text>{text[::-1][:-3]}</reversed_text>",  # a near miss
        text[::-1],  # right but untagged
        f"<think><reversed_text>{text[::-1]}</reversed_text></think>",
    ]
    return replies[:n]


def check_process(groups: list[dict], run: Run) -> None:
    for group in groups:
        exact, near, untagged, hidden = group["scores"]
        assert exact == 1.0 and 0.4 < near < 0.5 and untagged == hidden == 0.0


def check_evaluate(results: dict, samples: list[dict], run: Run) -> None:
    assert results["eval/accuracy"] == 1.0
    assert all(s["gold"] == s["text"][::-1] for s in samples)


# The questions every env is asked (tests/environments/test_env_table.py): exact,
# partial and untagged replies in `process`; `evaluate` on the test split.
PROCESS = ProcessRow(
    env=TextReversalEnv,
    model=scripted(policy),
    group_size=4,
    steps=2,
    scores=None,
    args=lambda run: ["--env.max_tokens", "200", "--env.max_token_length", "512"],
    check=check_process,
)
EVALUATE = EvaluateRow(
    env=TextReversalEnv,
    model=chat(
        lambda messages, n: [f"<reversed_text>{messages[-1]['content'][::-1]}</reversed_text>"] * n
    ),
    samples=12,
    check=check_evaluate,
)


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
