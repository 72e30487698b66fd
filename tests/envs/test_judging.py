"""The judge's verdict and rating parsing, and group scoring against a real judge server."""

from __future__ import annotations

import asyncio
import re

import pytest

from atroposlib.envs.judging import GroupJudge, JudgeUnavailable, parse_rating, parse_verdict
from atroposlib.envs.server_handling.server_manager import APIServerConfig, ServerManager
from tests.support.judges import prefer_good
from tests.support.policy_server import PolicyChatServer


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ("[[A]]", "A"),
        ("Reply B is clearer and correct.\n\nVerdict: [[B]]", "B"),
        ("Both are equally good. [[C]]", "tie"),
        ("A", "A"),
        ("b.", "B"),
        ("Verdict: A", "A"),
        ("**Verdict:** B", "B"),
        ("[[A]] ... on reflection [[B]]", None),  # contradictory
        ("I cannot decide between them.", None),  # garbled
        ("", None),
        ("[[D]]", None),
    ],
)
def test_parse_verdict(reply, verdict):
    assert parse_verdict(reply) == verdict


@pytest.mark.parametrize(
    ("reply", "rating"),
    [
        ("Helpful and correct. [[8]]", 8.0),
        ("Rating: 3", 3.0),
        ("first [[2]] then revised [[9]]", 9.0),
        ("[[11]]", None),
        ("[[0]]", None),
        ("great answer", None),
        ("", None),
    ],
)
def test_parse_rating(reply, rating):
    assert parse_rating(reply) == rating


def judge_over(server: PolicyChatServer, mode: str) -> GroupJudge:
    config = APIServerConfig(
        base_url=server.url, model_name="judge", api_key="x", server_type="openai", timeout=10
    )
    return GroupJudge(ServerManager([config], unavailable_timeout_s=2.0), mode)


PROMPT = [{"role": "user", "content": "Say something useful."}]


@pytest.mark.integration
def test_pairwise_scores_are_win_shares_with_both_orders_asked():
    with PolicyChatServer(prefer_good) as server:
        judge = judge_over(server, "pairwise")
        scores = asyncio.run(judge.score_group(PROMPT, ["GOOD 1", "bad", "GOOD 2", "meh"]))
        asked = [r["messages"][-1]["content"] for r in server.requests]
    assert scores == [1.0, 0.0, 1.0, 0.0]
    assert len(asked) == 8  # a ring of 4 comparisons, each in both orders
    orders = {re.search(r"\[Reply A\]\n(.*?)\n", a).group(1) for a in asked}
    assert orders == {"GOOD 1", "bad", "GOOD 2", "meh"}


@pytest.mark.integration
def test_unreadable_verdicts_count_as_ties_and_are_counted():
    with PolicyChatServer(prefer_good) as server:
        judge = judge_over(server, "pairwise")
        scores = asyncio.run(judge.score_group(PROMPT, ["CONFUSE", "GOOD"]))
    assert scores == [0.5, 0.5] and judge.unreadable == 2


@pytest.mark.integration
def test_rating_mode_normalises_to_unit_interval():
    with PolicyChatServer(prefer_good) as server:
        judge = judge_over(server, "rating")
        scores = asyncio.run(judge.score_group(PROMPT, ["GOOD", "bad"]))
    assert scores == [pytest.approx(8 / 9), 0.0]


@pytest.mark.integration
def test_a_dead_judge_raises_judge_unavailable():
    server = PolicyChatServer(prefer_good)
    server.close()  # the port is closed: nothing answers
    judge = judge_over(server, "rating")
    with pytest.raises(JudgeUnavailable, match="the judge did not answer"):
        asyncio.run(judge.score_group(PROMPT, ["x"]))
