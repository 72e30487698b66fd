"""The "think_format" reward: one non-empty `<think>` block first, then an answer."""

from __future__ import annotations

import pytest

from atroposlib.envs.reward_fns import registry
from atroposlib.envs.reward_fns.think_format_reward import think_format_ok

WELL_FORMED = [
    "<think>2 + 2 = 4</think> \\boxed{4}",
    "\n  <think>\nstep one\nstep two\n</think>\n\nThe answer is 4.",
]
MALFORMED = [
    ("\\boxed{4}", "no think block"),
    ("The answer is 4. <think>why</think>", "think block not first"),
    ("<think>2 + 2 = 4 \\boxed{4}", "never closed"),
    ("<think>a</think><think>b</think> 4", "two blocks"),
    ("<think>a<think>b</think></think> 4", "nested blocks"),
    ("<think>   </think> 4", "empty reasoning"),
    ("<think>2 + 2 = 4</think>   ", "no answer after the block"),
    ("<think>a</think> 4 </think>", "a stray closing tag"),
    ("</think> 4", "closing tag only"),
    ("<THINK>a</THINK> 4", "wrong case"),
    ("", "empty output"),
]


@pytest.mark.parametrize("completion", WELL_FORMED)
def test_well_formed(completion):
    assert think_format_ok(completion)


@pytest.mark.parametrize(("completion", "why"), MALFORMED)
def test_malformed(completion, why):
    assert not think_format_ok(completion), why


def test_over_long_reasoning_is_still_well_formed():
    assert think_format_ok("<think>" + "hmm " * 50_000 + "</think> 4")


def test_answer_optional_when_asked():
    assert think_format_ok("<think>a</think>", require_answer=False)
    assert not think_format_ok("<think></think>", require_answer=False)


def test_registered_reward():
    reward = registry.create({"type": "think_format", "weight": 0.5})
    completions = [
        WELL_FORMED[0],
        MALFORMED[0][0],
        {"role": "assistant", "content": WELL_FORMED[1]},
    ]
    assert reward(completions) == [0.5, 0.0, 0.5]
    assert registry.create("think_format", require_answer=False).compute(["<think>a</think>"]) == [
        1.0
    ]


def test_verdicts_agree_with_trls_think_format_reward_or_differ_as_documented():
    from tests.support.reward_agreement.compare import think_format_agreement

    agreement = think_format_agreement(n=400, seed=27)
    assert agreement.cases == 400
    assert agreement.disagreements == [], agreement.disagreements[:3]
    assert agreement.agreed >= 300
