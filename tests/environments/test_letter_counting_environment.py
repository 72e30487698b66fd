"""Letter counting: generated items over the shipped word list, scored exactly; its rows of
the env table (tests/environments/test_env_table.py)."""

from __future__ import annotations

import random
import re

from environments.letter_counting_environment import (
    WORDS,
    LetterCountingEnv,
    letter_count_score,
    load_words,
    make_item,
)
from tests.support.env_groups import assert_prompt_masked
from tests.support.env_table import EvaluateRow, ProcessRow, Run, chat, scripted
from tests.support.scripted_model import last_turn

QUESTION = re.compile(r"letter '(\w)' appear in '(\w+)'")


def true_count(prompt: str) -> int:
    letter, word = QUESTION.search(prompt).groups()
    return word.count(letter)


def tagged_policy(prompt: str, n: int) -> list[str]:
    count = true_count(last_turn(prompt))
    replies = [
        f"<think>spelling it out</think><answer>{count}</answer>",
        f"<answer>{count + 1}</answer>",
        f"<think><answer>{count}</answer></think>",  # only in the reasoning
        f"{count}",  # bare, not accepted in the tagged format
    ]
    return replies[:n]


def test_the_word_list_ships_and_items_cover_absent_letters():
    words = load_words(WORDS)
    assert len(words) > 2500 and all(w.isalpha() and w.islower() for w in words)
    items = [make_item(random.Random(seed), words) for seed in range(400)]
    assert all(i["count"] == i["word"].count(i["letter"]) for i in items)
    assert 0.1 < sum(i["count"] == 0 for i in items) / len(items) < 0.4


def test_scores_in_both_answer_formats():
    assert letter_count_score("<answer>2</answer>", 2) == 1.0
    assert letter_count_score("2", 2) == 0.0
    assert letter_count_score("2", 2, "bare") == 1.0
    assert letter_count_score("it is 1, no, 2", 2, "bare") == 1.0
    assert letter_count_score("<think>2", 2, "bare") == 0.0


def check_process(groups: list[dict], run: Run) -> None:
    for group in groups:
        assert_prompt_masked(group, run.tokenizer)


def check_evaluate(results: dict, samples: list[dict], run: Run) -> None:
    assert results["eval/accuracy"] == 1.0
    assert all(s["count"] == s["word"].count(s["letter"]) for s in samples)


def check_offline(groups: list[dict]) -> None:
    """The documented command (the bare format) on the tiny model."""
    for group in groups:
        assert set(group["scores"]) <= {0.0, 1.0}
        assert "Answer with the number only." in str(group["messages"][0])


# The questions every env is asked (tests/environments/test_env_table.py).
PROCESS = ProcessRow(
    env=LetterCountingEnv,
    model=scripted(tagged_policy),
    group_size=4,
    steps=2,
    scores=lambda group: [1.0, 0.0, 0.0, 0.0],
    args=lambda run: ["--env.max_tokens", "64", "--env.max_token_length", "512"],
    check=check_process,
)
EVALUATE = EvaluateRow(
    env=LetterCountingEnv,
    model=chat(lambda messages, n: [f"<answer>{true_count(messages[-1]['content'])}</answer>"] * n),
    samples=12,
    args=lambda run: ["--env.eval_size", "12"],
    check=check_evaluate,
)
OFFLINE = check_offline
