r"""The "math_verify" reward: math-verify on the final `\boxed{}` answers, after `</think>`."""

from __future__ import annotations

import threading

import pytest

from atroposlib.envs.reward_fns import registry
from atroposlib.envs.reward_fns.math_verify_reward import (
    boxed_contents,
    final_answer_region,
    gold_from_solution,
    grade_answer,
)

RIGHT = [
    (r"<think>16 - 3 - 4 = 9, 9 * 2 = 18</think> She makes \boxed{18} dollars.", "18"),
    (r"\boxed{18}", "18"),
    (r"So \boxed{1,234}.", "1234"),
    (r"\boxed{\$18}", "18"),
    (r"\boxed{18 \text{ dollars}}", "18"),
    (r"\boxed{18.0}", "18"),
    (r"\boxed{-3}", "-3"),
    (r"\boxed{0.5}", r"\frac{1}{2}"),
    (r"\boxed{\frac12}", "0.5"),
    (r"\boxed{1/2}", r"\frac{1}{2}"),
    (r"\boxed{\dfrac{3}{4}}", r"\frac{3}{4}"),
    (r"\boxed{\sqrt3}", r"\sqrt{3}"),
    (r"\boxed{\sqrt{8}}", r"2\sqrt{2}"),
    (r"\boxed{x = 5}", "5"),
    (r"\boxed{5}", "x=5"),
    (r"\boxed{(1, 2]}", "(1,2]"),
    (r"\boxed{[2,\infty)}", r"[2, \infty)"),
    (r"\boxed{3, 2}", "2, 3"),
    (r"\boxed{(x+1)^2}", "x^2+2x+1"),
    (r"\boxed{\pi/2}", r"\frac{\pi}{2}"),
    (r"\boxed{\begin{pmatrix}3\\1\end{pmatrix}}", r"\begin{pmatrix} 3 \\ 1 \end{pmatrix}"),
    (r"The answer is \boxed{18}. Checking again: \boxed{18}.", "18"),
    (r"\boxed {18}", "18"),
    (r"\boxed{18}", r"\boxed{18}"),
]
WRONG = [
    (r"\boxed{17}", "18"),
    (r"\boxed{(1, 2)}", "(1,2]"),
    (r"\boxed{y = 5}", "x=5"),
    (r"\boxed{2}", "2, 3"),
    (r"\boxed{3.14159}", r"\pi"),
    (r"\boxed{18.0000001}", "18"),
]
ADVERSARIAL = [
    # the right answer only inside the reasoning, a wrong (or no) final answer
    (r"<think>maybe \boxed{18}</think> The answer is \boxed{2}.", "no final right answer"),
    (r"<think>\boxed{18}</think> The answer is 18.", "final answer not boxed"),
    (r"<think>I think it is \boxed{18}", "reasoning never closed"),
    (r"<think>a</think> \boxed{2} <think>no wait \boxed{18}", "reopened reasoning"),
    # hedging and spoofing
    (r"\boxed{17} or \boxed{18}", "two different answers"),
    (r"\boxed{18}\boxed{19}", "two different answers"),
    (r"\boxed{18 \text{ or } 19}", "an 'or' inside one box"),
    (r"\boxed{17, 18, 19}", "a list of candidates"),
    (r"\boxed{ANSWER}", "the prompt's template"),
    (r"\boxed{}", "an empty box"),
    (r"\boxed{18", "an unclosed box"),
    (r"\fbox{18}", "not a \\boxed"),
    (r"The answer is 18.", "no box at all"),
    (r"$18$", "no box at all"),
    ("".join(rf"\boxed{{{n}}}" for n in range(10, 30)), "box spam"),
    (r"\boxed{" + "1+" * 600 + "1}", "an enormous answer"),
    ("", "empty output"),
    ("   \n", "blank output"),
]


@pytest.mark.parametrize(("completion", "gold"), RIGHT)
def test_right_answers_score(completion, gold):
    assert grade_answer(completion, gold) is True


@pytest.mark.parametrize(("completion", "gold"), WRONG)
def test_wrong_answers_do_not(completion, gold):
    assert grade_answer(completion, gold) is False


@pytest.mark.parametrize(("completion", "why"), ADVERSARIAL)
def test_adversarial_answers_do_not(completion, why):
    assert grade_answer(completion, "18") is False, why


def test_over_long_output_is_graded_on_its_final_box_only():
    padding = "Let me double check. " * 5000
    assert grade_answer(f"<think>{padding}</think> \\boxed{{18}}", "18") is True
    assert grade_answer(f"<think>{padding}\\boxed{{18}}", "18") is False


def test_answer_region_and_boxed_contents():
    assert final_answer_region("<think>a</think> b") == " b"
    assert final_answer_region("<think>a") is None
    assert final_answer_region("no tags") == "no tags"
    assert final_answer_region("</think> after a prefilled block") == " after a prefilled block"
    assert boxed_contents(r"\boxed{\frac{1}{2}} and \boxed{\{1,2\}}") == [
        r"\frac{1}{2}",
        r"\{1,2\}",
    ]
    assert gold_from_solution(r"So $x = \boxed{\frac{\sqrt{3}}{2}}$.") == r"\frac{\sqrt{3}}{2}"
    assert gold_from_solution("no box") is None


def test_an_unparseable_gold_scores_nothing():
    assert grade_answer(r"\boxed{18}", "") is False


def test_grading_off_the_main_thread_works():
    results = []
    thread = threading.Thread(target=lambda: results.append(grade_answer(r"\boxed{0.5}", "1/2")))
    thread.start()
    thread.join(30)
    assert results == [True]


def test_registered_reward_scores_batches():
    reward = registry.create("math_verify")
    completions = [
        r"<think>ok</think>\boxed{\frac{1}{2}}",
        {"role": "assistant", "content": r"\boxed{0.5}"},
        r"\boxed{2}",
        "",
    ]
    assert reward(completions, answer="0.5") == [1.0, 1.0, 0.0, 0.0]
    solutions = [r"Half: $\boxed{\frac12}$.", r"$\boxed{2}$", r"$\boxed{2}$", r"$\boxed{7}$"]
    assert reward.compute(completions, solution=solutions) == [1.0, 0.0, 1.0, 0.0]
    assert reward.compute(completions) == [0.0] * 4
    weighted = registry.create({"type": "math_verify", "weight": 2.0})
    assert weighted([r"\boxed{3}"], ground_truth="3") == [2.0]
