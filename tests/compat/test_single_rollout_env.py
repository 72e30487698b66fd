"""An upstream-style env that overrides only `collect_trajectory`, run unchanged.

The base class must call it `group_size` times per item and stack the
ScoredDataItems into one group, keeping each sequence's tokens, masks, score and
messages together. Served to a real run-api from the CPU inference server, and
run through `process`.
"""

from __future__ import annotations

import difflib

import pytest

from tests.support.compat_runs import process_groups, serve_flags, serve_groups, tiny_flags

pytest.importorskip("torch")

SCRIPT = "word_reversal_single.py"
WORDS = {"atropos", "gradient", "rollout", "tokenizer", "reward", "sampler", "trainer"}


def check_group(group: dict, size: int) -> None:
    """`size` stacked rollouts, each scored on its own reply, masks covering the reply."""
    assert len(group["tokens"]) == len(group["masks"]) == len(group["scores"]) == size
    assert len(group["messages"]) == size
    for tokens, masks, score, messages in zip(
        group["tokens"], group["masks"], group["scores"], group["messages"], strict=True
    ):
        assert len(tokens) == len(masks)
        assert masks[0] == -100 and any(m != -100 for m in masks)
        word, reply = messages[1]["content"], messages[-1]["content"]
        assert word in WORDS and messages[-1]["role"] == "assistant"
        expected = round(difflib.SequenceMatcher(None, word[::-1], reply.strip()).ratio(), 4)
        assert score == expected
    # one item per group: every rollout of it saw the same word
    assert len({m[1]["content"] for m in group["messages"]}) == 1


def test_serve_stacks_single_rollouts_into_groups(
    api_factory, inference_server, tiny_model_path, tmp_path
):
    api = api_factory()
    args = [
        *tiny_flags(tiny_model_path, f"{inference_server.url}/v1"),
        *serve_flags(api.url, "--env.ensure_scores_are_not_same", "false"),
        *("--env.include_messages", "true", "--env.group_size", "2"),
    ]
    groups, _ = serve_groups(
        api.url, SCRIPT, tmp_path / "serve", *args, batch_size=4, max_token_len=2048
    )
    assert len(groups) == 4
    for group in groups:
        check_group(group, 2)


def test_process_writes_stacked_groups(inference_server, tiny_model_path, tmp_path):
    groups = process_groups(
        SCRIPT,
        tmp_path,
        *tiny_flags(tiny_model_path, f"{inference_server.url}/v1"),
        *("--env.total_steps", "2", "--env.group_size", "3"),
        groups_file="rollouts.jsonl",
    )
    assert len(groups) == 2
    for group in groups:
        check_group(group, 3)
    assert [g["messages"][0][1]["content"] for g in groups] == ["atropos", "gradient"]
    page = (tmp_path / "rollouts.html").read_text()
    assert "gradient" in page
