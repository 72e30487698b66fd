r"""The "math_verify" reward against math-verify called as upstream Atropos calls it.

Every case agrees, or differs for a rule the reward's docstring states (checked case by
case in tests/support/reward_agreement/math_verify.py).
"""

from __future__ import annotations

from tests.support.reward_agreement import math_verify


def test_verdicts_agree_with_upstreams_math_verify_call_or_differ_as_documented():
    agreement = math_verify.math_verify_agreement(n=400, seed=27)
    assert agreement.cases == 400
    assert agreement.disagreements == [], agreement.disagreements[:3]
    assert agreement.agreed >= 280


def test_the_reference_is_upstreams_call():
    # upstream grades the text after the last </think>, and the whole reply without one
    assert math_verify.reference_verdict("16", r"<think>\boxed{16}")
    assert not math_verify.reference_verdict("16", r"<think>\boxed{16}</think> 17")
    # it joins every box into one set, reads anchored unboxed answers, and no shorthand
    assert not math_verify.reference_verdict("16", r"\boxed{16} or \boxed{17}")
    assert math_verify.reference_verdict("16", "The answer is $16$.")
    assert not math_verify.reference_verdict("0.5", r"\boxed{\frac12}")
    assert math_verify.reference_verdict("0.5", r"\boxed{\frac12}", malformed_operators=True)
    # and it passes the answer to verify first
    assert math_verify.reference_verdict(r"[0, \infty)", r"\boxed{x \geq 0}")
    assert not math_verify.reference_verdict(r"[0, \infty)", r"\boxed{x \geq 0}", gold_first=True)


def test_an_escaped_brace_does_not_hide_a_box():
    # found by the differential test: `\{` counted as a group once made the second box
    # look unclosed, so a right first box passed with a junk one beside it
    from atroposlib.envs.reward_fns.math_verify_reward import boxed_contents, grade_answer

    assert boxed_contents(r"\boxed{16} \boxed{\{}") == ["16", r"\{"]
    assert boxed_contents(r"\boxed{\{17} \boxed{16}") == [r"\{17", "16"]
    assert boxed_contents(r"\boxed{a \\{b}}") == [r"a \\{b}"]
    assert not grade_answer(r"\boxed{16} \boxed{\{}", "16")
    assert not grade_answer(r"\boxed{\{17} \boxed{16}", "16")
