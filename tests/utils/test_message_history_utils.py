"""Thinking truncation and trajectory token limits, counted with the tiny model's real tokenizer.

Inputs follow upstream's game environments (blackjack): "environment" observations,
"agent" replies, steps carrying `seed` and `parsed_actions`.
"""

from __future__ import annotations

import copy

import pytest

from atroposlib.utils.message_history_utils import (
    ensure_trajectory_token_limit,
    strip_thinking,
    truncate_thinking,
)
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

FIRST = "First I count the cards in my hand and the dealer's card."
LAST = "Then I decide to stick."
CALL = '<tool_call>{"name": "take_action", "arguments": {"action": "stick"}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def count(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


# --- strip_thinking ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>plan</think>\n\nAnswer: 4", "\n\nAnswer: 4"),
        ("Before <think>x\ny</think> after", "Before  after"),
        ("no reasoning", "no reasoning"),
        ("<think>never closed", "<think>never closed"),
        ("</think>closed before <think>opened", "</think>closed before <think>opened"),
        ("<think>a</think>b<think>c</think>d", "b<think>c</think>d"),
    ],
)
def test_strip_thinking(text, expected):
    assert strip_thinking(text) == expected


# --- truncate_thinking ------------------------------------------------------------------------


def test_short_block_is_kept_and_normalised(tokenizer):
    text = f"Hmm <think>  {LAST} \n</think>{CALL}"
    assert truncate_thinking(text, tokenizer, 100) == f"Hmm <think>\n{LAST}\n</think>{CALL}"


def test_block_of_exactly_the_limit_is_not_truncated(tokenizer):
    limit = count(tokenizer, LAST)
    assert truncate_thinking(f"<think>{LAST}</think>x", tokenizer, limit) == (
        f"<think>\n{LAST}\n</think>x"
    )


@pytest.mark.parametrize("inner", ["", "   ", "\n\n"])
def test_empty_block_collapses(tokenizer, inner):
    assert (
        truncate_thinking(f"<think>{inner}</think>{CALL}", tokenizer, 5) == f"<think></think>{CALL}"
    )


def test_long_block_keeps_its_last_paragraph_when_that_fits(tokenizer):
    content = f"{FIRST}\n\n{LAST}"
    limit = count(tokenizer, LAST)
    assert count(tokenizer, content) > limit
    result = truncate_thinking(f"<think>{content}</think>{CALL}", tokenizer, limit)
    assert result == f"<think>\n... {LAST}\n</think>{CALL}"


def test_long_paragraph_keeps_its_last_tokens(tokenizer):
    ids = tokenizer.encode(FIRST, add_special_tokens=False)
    tail = tokenizer.decode(ids[-6:], skip_special_tokens=True)
    result = truncate_thinking(f"<think>{FIRST}</think>{CALL}", tokenizer, 6)
    assert result == f"<think>\n... {tail.strip()}\n</think>{CALL}"
    assert FIRST.endswith(tail) and len(tail) < len(FIRST)


def test_last_paragraph_too_long_falls_back_to_the_tail_of_everything(tokenizer):
    content = f"{LAST}\n\n{FIRST}"
    ids = tokenizer.encode(content, add_special_tokens=False)
    limit = count(tokenizer, FIRST) - 1
    tail = tokenizer.decode(ids[-limit:], skip_special_tokens=True)
    result = truncate_thinking(f"<think>{content}</think>", tokenizer, limit)
    assert result == f"<think>\n... {tail.strip()}\n</think>"


@pytest.mark.parametrize("limit", [0, -3])
def test_no_budget_empties_the_block(tokenizer, limit):
    assert truncate_thinking(f"<think>{FIRST}</think>{CALL}", tokenizer, limit) == (
        f"<think></think>{CALL}"
    )


@pytest.mark.parametrize(
    "text", ["plain answer", "<think>never closed", "</think>x<think>y", f"{CALL}"]
)
def test_text_without_a_block_is_unchanged(tokenizer, text):
    assert truncate_thinking(text, tokenizer, 3) == text


def test_a_failing_tokenizer_leaves_the_text_unchanged():
    text = f"<think>{FIRST}</think>{CALL}"
    assert truncate_thinking(text, None, 3) == text


# --- ensure_trajectory_token_limit ------------------------------------------------------------

SYSTEM = {"role": "system", "content": "You play blackjack. Call take_action."}


def env(i: int) -> dict:
    return {"role": "environment", "content": f"Your hand sums to {10 + i}; dealer shows {i}."}


def agent(text: str) -> dict:
    return {"role": "agent", "content": f"<think>\n{text}\n</think>{CALL}"}


def history(last: str) -> list[dict]:
    return [SYSTEM, env(1), agent("hit"), env(2), agent("hit again"), env(3), agent(last)]


def step(tokenizer, alternatives: list[list[dict]], seed: int = 7, **extra) -> dict:
    tokenized = [tokenize_for_trainer(tokenizer, messages) for messages in alternatives]
    return {
        "seed": seed,
        "messages": alternatives,
        "tokens": [t["tokens"] for t in tokenized],
        "masks": [t["masks"] for t in tokenized],
        "scores": [1.0, -1.0][: len(alternatives)],
        "parsed_actions": [0, 1][: len(alternatives)],
        **extra,
    }


def longest(tokenizer, alternatives: list[list[dict]]) -> int:
    return max(len(tokenize_for_trainer(tokenizer, m)["tokens"]) for m in alternatives)


def test_steps_within_the_limit_are_kept_as_they_are(tokenizer):
    alternatives = [history("stick"), history("a much longer reasoning before I stick")]
    data = step(tokenizer, alternatives, overrides=[{}, {}])
    limit = longest(tokenizer, alternatives)
    result = ensure_trajectory_token_limit([data], tokenizer, limit)
    assert len(result) == 1 and result[0] is data


def test_old_turn_pairs_are_dropped_until_the_step_fits(tokenizer):
    alternatives = [history("stick"), history("a much longer reasoning before I stick")]
    data = step(tokenizer, alternatives, overrides=[{}, {}])
    original = copy.deepcopy(data)
    once = [[m[0], *m[3:]] for m in alternatives]  # the oldest (observation, reply) pair gone
    limit = longest(tokenizer, once)
    assert limit < longest(tokenizer, alternatives)

    (result,) = ensure_trajectory_token_limit([data], tokenizer, limit)

    assert result["messages"] == once
    expected = [tokenize_for_trainer(tokenizer, m) for m in once]
    assert result["tokens"] == [e["tokens"] for e in expected]
    assert result["masks"] == [e["masks"] for e in expected]
    assert set(result) == {"seed", "messages", "tokens", "masks", "scores", "parsed_actions"}
    assert (result["seed"], result["scores"], result["parsed_actions"]) == (7, [1.0, -1.0], [0, 1])
    assert data == original, "the input step was modified"


def test_truncation_stops_at_system_prompt_last_observation_and_reply(tokenizer):
    alternatives = [history("stick"), history("a much longer reasoning before I stick")]
    minimal = [[m[0], m[-2], m[-1]] for m in alternatives]
    limit = longest(tokenizer, minimal)
    (result,) = ensure_trajectory_token_limit([step(tokenizer, alternatives)], tokenizer, limit)
    assert result["messages"] == minimal
    assert max(len(t) for t in result["tokens"]) == limit

    assert (
        ensure_trajectory_token_limit([step(tokenizer, alternatives)], tokenizer, limit - 1) == []
    )


def test_single_messages_are_dropped_when_no_pair_starts_the_history(tokenizer):
    user = {"role": "user", "content": "Let us play a few rounds of blackjack now, shall we?"}
    alternatives = [[SYSTEM, user, env(1), agent("stick")]]
    data = step(tokenizer, alternatives)
    limit = longest(tokenizer, [[SYSTEM, env(1), agent("stick")]])
    (result,) = ensure_trajectory_token_limit([data], tokenizer, limit)
    assert result["messages"] == [[SYSTEM, env(1), agent("stick")]]


def test_an_alternative_never_loses_what_it_must_keep(tokenizer):
    short = [SYSTEM, env(3), agent("stick")]
    long = history("stick")
    limit = longest(tokenizer, [short, [long[0], *long[3:]]])
    (result,) = ensure_trajectory_token_limit([step(tokenizer, [short, long])], tokenizer, limit)
    assert result["messages"][0] == short
    assert result["messages"][1] == [long[0], *long[3:]]


def test_incomplete_steps_are_dropped_and_good_ones_kept_in_order(tokenizer):
    alternatives = [history("stick")]
    good = [step(tokenizer, alternatives, seed=s) for s in (1, 2)]
    no_seed = {**step(tokenizer, alternatives), "seed": None}
    no_actions = {k: v for k, v in step(tokenizer, alternatives).items() if k != "parsed_actions"}
    no_tokens = {**step(tokenizer, alternatives), "tokens": []}
    trajectory = [good[0], no_seed, no_actions, no_tokens, good[1]]
    result = ensure_trajectory_token_limit(trajectory, tokenizer, 10_000)
    assert [s["seed"] for s in result] == [1, 2]


def test_empty_trajectory(tokenizer):
    assert ensure_trajectory_token_limit([], tokenizer, 10) == []
