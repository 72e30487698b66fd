"""MCQA with thinking: MMLU rows to lettered prompts, the hub path, and its rows of the env
table (the letter reward, the MMLU-style eval: tests/environments/test_env_table.py)."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import types

from environments.mcqa_thinking_env import SAMPLE, MCQAThinkingEnv, item_from_row
from tests.support.env_table import EvaluateRow, ProcessRow, Run, chat, scripted
from tests.support.scripted_model import last_turn

GOLD = {
    row["question"]: chr(ord("A") + row["answer"])
    for split in ("train", "test")
    for row in map(json.loads, (SAMPLE / f"{split}.jsonl").read_text().splitlines())
}


def gold_for(text: str) -> str:
    return GOLD[text.split("\n\n")[0]]


def policy(prompt: str, n: int) -> list[str]:
    gold = gold_for(last_turn(prompt))
    wrong = "A" if gold != "A" else "B"
    replies = [
        f"<think>Checking each option.</think><answer>{gold}</answer>",
        f"<think>Checking each option.</think><answer>{wrong}</answer>",
        f"<answer>{gold}</answer>",  # no thinking
        f"<think>It is <answer>{gold}</answer></think><answer>{wrong}</answer>",
    ]
    return replies[:n]


def biology_wrong(messages, n):
    """Right on every subject but biology, so per-subject accuracy is checkable."""
    question = messages[-1]["content"]
    letter = gold_for(question)
    if "cell" in question or "blood" in question or "DNA" in question:
        letter = "A" if letter != "A" else "B"
    return [f"<think>ok</think><answer>{letter}</answer>"] * n


def test_rows_become_lettered_items_and_malformed_rows_are_skipped():
    row = {"question": "Q?", "subject": "x", "choices": ["a", "b", "c"], "answer": 2}
    assert item_from_row(row)["gold"] == "C"
    assert item_from_row({**row, "answer": 3}) is None
    assert item_from_row({**row, "choices": "abc"}) is None


def check_process(groups: list[dict], run: Run) -> None:
    assert re.search(r"\nA\) .*\nB\) ", groups[0]["messages"][0][1]["content"])


def check_evaluate(results: dict, samples: list[dict], run: Run) -> None:
    biology = [s for s in samples if s["subject"] == "high_school_biology"]
    wrong = [s for s in biology if s["score"] == 0.0]
    assert results["eval/accuracy"] == (40 - len(wrong)) / 40
    assert 0 < len(wrong) < len(biology)
    assert results["eval/accuracy_high_school_biology"] == 1 - len(wrong) / len(biology)
    assert results["eval/accuracy_world_history"] == 1.0


# The questions every env is asked (tests/environments/test_env_table.py).
PROCESS = ProcessRow(
    env=MCQAThinkingEnv,
    model=scripted(policy),
    group_size=4,
    steps=2,
    scores=lambda group: [1.0, 0.0, 0.0, 0.0],
    args=lambda run: ["--env.max_tokens", "64", "--env.max_token_length", "512"],
    check=check_process,
)
EVALUATE = EvaluateRow(
    env=MCQAThinkingEnv, model=chat(biology_wrong), samples=40, check=check_evaluate
)


def test_the_hub_path_reads_mmlu(monkeypatch, tiny_model_path):
    calls = []
    row = {"question": "Q?", "subject": "s", "choices": ["a", "b"], "answer": 1}

    def load_dataset(name, subset=None, split=None):
        calls.append((name, subset, split))
        return [row]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    config, servers = MCQAThinkingEnv.config_init()
    update = {"data_source": "hub", "tokenizer_name": str(tiny_model_path)}
    env = MCQAThinkingEnv(config.model_copy(update=update), servers, testing=True)
    asyncio.run(env.setup())
    assert calls == [("cais/mmlu", "all", "auxiliary_train"), ("cais/mmlu", "all", "test")]
    assert env.eval_items[0]["gold"] == "B"
