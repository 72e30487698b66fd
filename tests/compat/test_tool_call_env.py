"""An upstream-style hermes tool-calling env, its replies parsed by `parse_tool_call`.

A scripted model (real HTTP) answers each request with a right call, a call with
wrong arguments and prose, so the scores the env gives are known exactly.
"""

from __future__ import annotations

import pytest

from tests.support.compat_policies import HERMES_SCORES, TOOL_ANSWERS, hermes_policy
from tests.support.compat_runs import process_groups, serve_flags, serve_groups, tiny_flags
from tests.support.policy_server import PolicyChatServer, policy_fixture

pytest.importorskip("torch")

SCRIPT = "hermes_tool_call_server.py"


model = policy_fixture(hermes_policy)


def kind_of(reply: str) -> str:
    if "<tool_call>" not in reply:
        return "prose"
    return "wrong_args" if "WRONG" in reply else "right"


def check_group(group: dict) -> None:
    assert sorted(group["scores"]) == [-1.0, 0.0, 1.0]
    for tokens, masks, score, messages in zip(
        group["tokens"], group["masks"], group["scores"], group["messages"], strict=True
    ):
        assert len(tokens) == len(masks) and any(m != -100 for m in masks)
        assert messages[1]["content"] in TOOL_ANSWERS
        assert score == HERMES_SCORES[kind_of(messages[-1]["content"])]


def check_requests(model: PolicyChatServer) -> None:
    assert model.requests, "the env never called the model"
    for request in model.requests:
        assert request["n"] == 3
        system = request["messages"][0]["content"]
        assert "<tools>" in system and "get_weather" in system and "convert_currency" in system


def test_serve_scores_parsed_tool_calls(api_factory, model, tiny_model_path, tmp_path):
    api = api_factory()
    args = [*tiny_flags(tiny_model_path, model.url), *serve_flags(api.url)]
    groups, _ = serve_groups(
        api.url, SCRIPT, tmp_path / "serve", *args, batch_size=6, max_token_len=4096
    )
    assert len(groups) == 4
    for group in groups:
        check_group(group)
    check_requests(model)


def test_process_scores_parsed_tool_calls(model, tiny_model_path, tmp_path):
    groups = process_groups(
        SCRIPT,
        tmp_path,
        *tiny_flags(tiny_model_path, model.url),
        *("--env.total_steps", "2"),
        groups_file="tools.jsonl",
    )
    assert len(groups) == 2
    for group in groups:
        check_group(group)
    assert {g["messages"][0][1]["content"] for g in groups} == set(TOOL_ANSWERS)
    assert (tmp_path / "tools.html").exists()
    check_requests(model)
