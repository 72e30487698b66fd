"""The "math_think" reward: correctness minus a cost for a malformed think block."""

from __future__ import annotations

import pytest

from atroposlib.envs.reward_fns import registry
from atroposlib.envs.reward_fns.math_think_reward import math_think_score

CASES = [
    ("<think>9 * 2</think> \\boxed{18}", 1.0),
    ("\\boxed{18}", 0.9),  # right, but no think block
    ("<think>9 * 2</think> \\boxed{19}", 0.0),
    ("<think>\\boxed{18}</think> \\boxed{19}", 0.0),  # right only while reasoning
    ("<think>so \\boxed{18}", -0.1),  # never closed: no answer, malformed
    ("<think>a</think><think>b</think> \\boxed{18}", 0.9),  # right, two blocks
    ("<think>a</think> \\boxed{17} or \\boxed{18}", 0.0),
    ("", -0.1),
]


@pytest.mark.parametrize(("completion", "expected"), CASES)
def test_scores(completion, expected):
    assert math_think_score(completion, "18", format_weight=0.1) == pytest.approx(expected)


def test_truncated_completion_scores_as_wrong_and_malformed():
    text = "<think>" + "step " * 10_000 + "</think> \\boxed{18}"
    assert math_think_score(text, "18", 0.1) == 1.0
    assert math_think_score(text, "18", 0.1, truncated=True) == pytest.approx(-0.1)


def test_weight_zero_is_plain_correctness():
    assert math_think_score("\\boxed{18}", "18", format_weight=0.0) == 1.0
    assert math_think_score("", "18", format_weight=0.0) == 0.0


def test_registered_reward_reads_finish_reason():
    reward = registry.create({"type": "math_think", "format_weight": 0.2})
    completions = [
        "<think>ok</think> \\boxed{\\frac{1}{2}}",
        {
            "role": "assistant",
            "content": "<think>ok</think> \\boxed{0.5}",
            "finish_reason": "length",
        },
        "\\boxed{0.5}",
    ]
    assert reward.compute(completions, answer="0.5") == pytest.approx([1.0, -0.2, 0.8])
    assert reward.compute(completions) == [0.0, 0.0, 0.0]
