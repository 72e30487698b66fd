"""The MATH env: samples and rows, the hub path, and its rows of the env table
(`process`/`serve`/`evaluate` end to end: tests/environments/test_env_table.py)."""

from __future__ import annotations

import asyncio
import sys
import types

import pytest

from atroposlib.envs.base import APIServerConfig
from atroposlib.envs.data_source import read_jsonl
from atroposlib.envs.reward_fns.math_verify_reward import gold_from_solution, grade_answer
from environments.math_server import (
    EVAL_SAMPLE_DIR,
    SAMPLE_DIR,
    MathConfig,
    MathEnv,
    accuracy_metrics,
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
TEST = read_jsonl(EVAL_SAMPLE_DIR / "test.jsonl")
GOLD = {r["question"]: r["final_answer"] for r in TRAIN} | {r["problem"]: r["answer"] for r in TEST}
DEEPMATH_COLUMNS = {"question", "final_answer", "difficulty", "topic"} | {
    f"r1_solution_{i}" for i in (1, 2, 3)
}
MATH500_COLUMNS = {"problem", "solution", "answer", "subject", "level", "unique_id"}
MAX_TOKENS = 150


def replies(problem: str) -> list[str]:
    """Right and well formed, right in two think blocks, a hedge, cut off."""
    gold = GOLD[problem]
    return [
        f"<think>Work it out.</think> The answer is $\\boxed{{{gold}}}$.",
        f"<think>a</think><think>b</think> \\boxed{{{gold}}}",
        f"<think>two candidates</think> \\boxed{{{gold}}} or \\boxed{{-12345}}",
        "<think>" + "and then " * 40 + f"</think> \\boxed{{{gold}}}",
    ]


EXPECTED = [1.0, 0.9, 0.0, -0.1]
POLICY = scripted(lambda prompt, n: replies(last_turn(prompt))[:n])


def test_the_shipped_samples_have_the_hub_columns_and_gradeable_golds():
    assert len(TRAIN) >= 40 and len(TEST) >= 39
    assert all(set(r) == DEEPMATH_COLUMNS for r in TRAIN)
    assert all(set(r) == MATH500_COLUMNS for r in TEST)
    for row in TRAIN:
        assert grade_answer(row["r1_solution_1"], row["final_answer"])
    for row in TEST:
        assert gold_from_solution(row["solution"]) == row["answer"]
        assert grade_answer(f"\\boxed{{{row['answer']}}}", row["answer"])
    assert not set(GOLD) - {r["question"] for r in TRAIN} - {r["problem"] for r in TEST}
    assert len({r["subject"] for r in TEST}) == 7 and {r["level"] for r in TEST} >= {1, 2, 3}


def test_rows_of_each_format_convert():
    deepmath = item_from_row({"question": "Q", "final_answer": "\\frac12", "topic": "T"})
    assert deepmath["problem"] == "Q" and deepmath["gold"] == "\\frac12"
    math500 = item_from_row(TEST[0])
    assert math500["gold"] == TEST[0]["answer"] and math500["level"] == TEST[0]["level"]
    hendrycks = item_from_row(
        {"problem": "P", "solution": "So $\\boxed{\\sqrt{3}}$.", "level": "Level 2", "type": "X"}
    )
    assert hendrycks == {
        "problem": "P",
        "gold": "\\sqrt{3}",
        "subject": "X",
        "level": "Level 2",
        "unique_id": "",
    }
    assert item_from_row({"question": "Q", "final_answer": None}) is None


def test_accuracy_metrics_by_subject_and_level():
    samples = [
        {"score": 1, "subject": "Number Theory", "level": 1},
        {"score": 0, "subject": "Number Theory", "level": 2},
        {"score": 1, "subject": "Algebra", "level": 2},
    ]
    assert accuracy_metrics(samples, "math500") == pytest.approx(
        {
            "eval/math500_percent_correct": 2 / 3,
            "eval/overall_percent_correct": 2 / 3,
            "eval/math500_number_theory_percent_correct": 0.5,
            "eval/math500_algebra_percent_correct": 1.0,
            "eval/math500_level_1_percent_correct": 1.0,
            "eval/math500_level_2_percent_correct": 0.5,
        }
    )


def check_process(groups: list[dict], run: Run) -> None:
    train_questions = {r["question"] for r in TRAIN}
    for group in groups:
        assert group["messages"][0][1]["content"] in train_questions
        assert group["overrides"] == [{}, {}, {}, {"set_advantage_to_zero": True}]
        assert_prompt_masked(group, run.tokenizer)
    assert all(r["top_p"] == 0.95 for r in run.model.requests)


def eval_reply(problem: str) -> str:
    """Right (in an equivalent form where one is easy) exactly on level-1 problems."""
    row = next(r for r in TEST if r["problem"] == problem)
    if row["level"] != 1:
        return f"<think>\\boxed{{{row['answer']}}}</think> \\boxed{{-12345}}"
    answer = {"\\frac{3}{10}": "0.3", "\\frac{1}{9}": "1/9", "\\frac{\\pi}{2}": "\\pi/2"}.get(
        row["answer"], row["answer"]
    )
    return f"<think>easy</think> \\boxed{{{answer}}}"


def check_evaluate(results: dict, samples: list[dict], run: Run) -> None:
    level_one = [r for r in TEST if r["level"] == 1]
    assert results["eval/math500_percent_correct"] == pytest.approx(len(level_one) / len(TEST))
    assert results["eval/overall_percent_correct"] == results["eval/math500_percent_correct"]
    assert results["eval/math500_level_1_percent_correct"] == 1.0
    assert results["eval/math500_level_3_percent_correct"] == 0.0
    algebra = [r for r in TEST if r["subject"] == "Algebra"]
    assert results["eval/math500_algebra_percent_correct"] == pytest.approx(
        sum(r["level"] == 1 for r in algebra) / len(algebra)
    )
    assert results["eval/format_rate"] == 1.0
    by_id = {s["unique_id"]: s for s in samples}
    assert len(by_id) == len(TEST) == len(run.model.requests)
    for row in TEST:
        sample = by_id[row["unique_id"]]
        assert sample["score"] == int(row["level"] == 1) and sample["gold_answer"] == row["answer"]
        assert sample["response"] == eval_reply(row["problem"])


# The questions every env is asked (tests/environments/test_env_table.py).
ARGS = ["--env.max_tokens", str(MAX_TOKENS), "--env.max_token_length", "2048"]
PROCESS = ProcessRow(
    env=MathEnv,
    model=POLICY,
    group_size=4,
    steps=2,
    scores=lambda group: EXPECTED,
    args=lambda run: ARGS,
    check=check_process,
)
SERVE = ServeRow(
    env=MathEnv,
    model=POLICY,
    group_size=4,
    batch_size=8,
    max_token_len=2048,
    groups=4,
    scores=lambda group: EXPECTED,
    args=lambda run: ARGS,
)
EVALUATE = EvaluateRow(
    env=MathEnv,
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
        return TRAIN[:6] if name == "zwhe99/DeepMath-103K" else TEST[:4]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    config = MathConfig(data_source="hub", tokenizer_name=str(tiny_model_path), use_wandb=False)
    env = MathEnv(config, APIServerConfig(model_name="tiny"), testing=True)
    asyncio.run(env.setup())
    assert calls == [
        ("zwhe99/DeepMath-103K", None, "train"),
        ("HuggingFaceH4/MATH-500", None, "test"),
    ]
    assert sorted(i["problem"] for i in env.train_items) == sorted(r["question"] for r in TRAIN[:6])
    assert [i["unique_id"] for i in env.eval_items] == [r["unique_id"] for r in TEST[:4]]
    item = env.eval_items[0]
    assert env.score(replies(item["problem"])[0], item) == 1.0
    assert env.score(replies(item["problem"])[2], item) == 0.0
