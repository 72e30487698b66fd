"""The GSM8K env: its sample and grader, the hub path, and its rows of the env table
(`process`/`serve`/`evaluate` end to end: tests/environments/test_env_table.py)."""

from __future__ import annotations

import asyncio
import sys
import types

import pytest

from atroposlib.envs.base import APIServerConfig
from atroposlib.envs.data_source import read_jsonl
from environments.gsm8k_server import (
    SAMPLE_DIR,
    GSM8KConfig,
    GSM8KEnv,
    gold_answer,
    item_from_row,
)
from tests.support.env_groups import assert_prompt_masked
from tests.support.env_table import (
    EvaluateRow,
    ProcessRow,
    Run,
    ServeRow,
    chat,
    scores_and_questions_within,
    scripted,
)
from tests.support.scripted_model import last_turn

TRAIN = read_jsonl(SAMPLE_DIR / "train.jsonl")
TEST = read_jsonl(SAMPLE_DIR / "test.jsonl")
GOLD = {row["question"]: gold_answer(row["answer"]) for row in TRAIN + TEST}
MAX_TOKENS = 120  # the tiny tokenizer is about a token per character


def wrong(gold: str) -> str:
    return str(float(gold) + 1)


def replies(question: str) -> list[str]:
    """Right and well formed, right without <think>, right only while thinking, cut off."""
    gold = GOLD[question]
    return [
        f"<think>Work it out step by step.</think> So the answer is \\boxed{{{gold}}}.",
        f"The answer is \\boxed{{{gold}}}.",
        f"<think>Is it \\boxed{{{gold}}}? No.</think> \\boxed{{{wrong(gold)}}}",
        "<think>" + "and then " * 40 + f"</think> \\boxed{{{gold}}}",
    ]


EXPECTED = [1.0, 0.9, 0.0, -0.1]
POLICY = scripted(lambda prompt, n: replies(last_turn(prompt))[:n])


def test_the_shipped_sample_is_gsm8k_shaped():
    assert len(TRAIN) >= 40 and len(TEST) >= 30
    assert not {r["question"] for r in TRAIN} & {r["question"] for r in TEST}
    for row in TRAIN + TEST:
        assert set(row) == {"question", "answer"}
        steps, final = row["answer"].rsplit("\n#### ", 1)
        assert "<<" in steps and float(final.replace(",", "")) == float(gold_answer(row["answer"]))
    assert sum(p.stat().st_size for p in SAMPLE_DIR.iterdir()) < 1 << 20


def test_rows_convert_and_gold_drops_thousands_separators():
    row = {"question": "How many?", "answer": "1000 * 12 = <<1000*12=12000>>12000\n#### 12,000"}
    assert item_from_row(row) == {**row, "gold": "12000"}
    assert gold_answer("#### -3.5") == "-3.5"


def check_process(groups: list[dict], run: Run) -> None:
    for group in groups:
        question = group["messages"][0][1]["content"]
        assert question in GOLD and "<think>" in group["messages"][0][0]["content"]
        assert group["overrides"] == [{}, {}, {}, {"set_advantage_to_zero": True}]
        assert [m[-1]["content"] for m in group["messages"]][:3] == replies(question)[:3]
        assert_prompt_masked(group, run.tokenizer)
    assert all(r["max_tokens"] == MAX_TOKENS for r in run.model.requests)


def eval_reply(question: str) -> str:
    """Right (and well formed) exactly when the gold is even."""
    gold = GOLD[question]
    if float(gold) % 2 == 0:
        return f"<think>even</think> \\boxed{{{gold}}}"
    return f"<think>\\boxed{{{gold}}}</think> \\boxed{{{wrong(gold)}}}"


def check_evaluate(results: dict, samples: list[dict], run: Run) -> None:
    even = sum(float(gold_answer(r["answer"])) % 2 == 0 for r in TEST)
    assert 0 < even < len(TEST)
    assert results["eval/percent_correct"] == pytest.approx(even / len(TEST))
    assert results["eval/format_rate"] == pytest.approx(1.0)
    assert len(run.model.requests) == len(TEST)
    for sample in samples:
        assert sample["gold_answer"] == GOLD[sample["question"]]
        assert sample["response"] == eval_reply(sample["question"])
        assert sample["score"] == int(float(sample["gold_answer"]) % 2 == 0)


# The questions every env is asked (tests/environments/test_env_table.py).
ARGS = ["--env.max_tokens", str(MAX_TOKENS), "--env.max_token_length", "2048"]
PROCESS = ProcessRow(
    env=GSM8KEnv,
    model=POLICY,
    group_size=4,
    steps=2,
    scores=lambda group: EXPECTED,
    args=lambda run: ARGS,
    check=check_process,
)
SERVE = ServeRow(
    env=GSM8KEnv,
    model=POLICY,
    group_size=4,
    batch_size=8,
    max_token_len=2048,
    groups=4,
    scores=lambda group: EXPECTED,
    args=lambda run: ARGS,
)
EVALUATE = EvaluateRow(
    env=GSM8KEnv,
    model=chat(lambda messages, n: [eval_reply(messages[-1]["content"])] * n),
    samples=len(TEST),
    check=check_evaluate,
)
# the documented command on the tiny model: its noise scores within the reward's range
OFFLINE = scores_and_questions_within(EXPECTED, GOLD)


def test_hub_rows_load_and_convert(monkeypatch, tiny_model_path):
    calls = []

    def load_dataset(name, subset=None, split=None):
        calls.append((name, subset, split))
        return TRAIN[:5] if split == "train" else TEST[:3]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    config = GSM8KConfig(data_source="hub", tokenizer_name=str(tiny_model_path), use_wandb=False)
    env = GSM8KEnv(config, APIServerConfig(model_name="tiny"), testing=True)
    asyncio.run(env.setup())
    assert calls == [("openai/gsm8k", "main", "train"), ("openai/gsm8k", "main", "test")]
    assert len(env.train_items) == 5 and [i["question"] for i in env.eval_items] == [
        r["question"] for r in TEST[:3]
    ]
    item = env.eval_items[0]
    assert env.score(replies(item["question"])[0], item) == 1.0
    assert env.score(replies(item["question"])[2], item) == 0.0
