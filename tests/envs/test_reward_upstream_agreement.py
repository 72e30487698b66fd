"""The upstream-named rewards against upstream Atropos 0.4.0's own implementation.

Upstream's package runs in a subprocess from `.venv/reference` (see
`tests/support/reward_agreement/upstream.py`); each reward must agree with it on every
generated case or differ for a reason stated in its docstring, which the comparison
checks by rerunning upstream on the case rewritten for that reason.
"""

from __future__ import annotations

import pytest

from tests.support.reward_agreement import upstream
from tests.support.reward_agreement.compare import LITERAL_TAGS, NULL_CONTENT, upstream_agreements

pytestmark = pytest.mark.integration  # a subprocess, and the tiny model for cosine_scaled

REWARDS = {
    "r1",
    "format",
    "reasoning_steps",
    "repetition_penalty",
    "crossword_format",
    "accuracy",
    "cascading_r1_math",
    "combined",
    "cosine_scaled",
}


@pytest.fixture(scope="module")
def agreements(tiny_model_path):
    return {a.reward: a for a in upstream_agreements(str(tiny_model_path), n=200, seed=27)}


def test_the_reference_is_upstreams_package_not_this_one():
    runner = upstream.RUNNER.read_text()
    assert "atroposlib.__file__.startswith(reference)" in runner
    assert (upstream.REFERENCE_DIR / "atroposlib" / "envs" / "reward_fns").is_dir(), (
        upstream.NOT_INSTALLED
    )


def test_every_upstream_named_reward_is_compared(agreements):
    assert set(agreements) == REWARDS


@pytest.mark.parametrize("reward", sorted(REWARDS))
def test_verdicts_agree_with_upstream_or_differ_as_documented(agreements, reward):
    agreement = agreements[reward]
    assert agreement.disagreements == [], agreement.disagreements[:3]
    assert agreement.agreed >= 0.8 * agreement.cases, agreement.line()


def test_the_documented_differences_are_exercised(agreements):
    """Cases in the documented families are generated, and only there do verdicts differ."""
    assert agreements["format"].deliberate.get(LITERAL_TAGS, 0) > 0
    assert sum(a.deliberate.get(NULL_CONTENT, 0) for a in agreements.values()) > 0
    reasons = {why for a in agreements.values() for why in a.deliberate}
    assert reasons <= {LITERAL_TAGS, NULL_CONTENT}


def test_a_difference_nothing_explains_fails_the_comparison(monkeypatch):
    from atroposlib.envs.reward_fns.reasoning_steps_reward import ReasoningStepsReward

    original = ReasoningStepsReward.compute

    def off_by_a_little(self, completions, **kwargs):
        return [score + 0.01 for score in original(self, completions, **kwargs)]

    monkeypatch.setattr(ReasoningStepsReward, "compute", off_by_a_little)
    agreements = {a.reward: a for a in upstream_agreements(None, n=10, seed=1)}
    assert "cosine_scaled" not in agreements  # no model, no cosine cases
    assert len(agreements["reasoning_steps"].disagreements) == 10
    assert agreements["format"].disagreements == []
