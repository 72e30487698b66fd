"""The answer-tag rewards on real right, wrong and adversarial replies.

`answer_tag` (letter counting, shape counting), `choice_letter` (multiple choice) and
`reversal_similarity` (text reversal) share one reading of a reply: the answer is the
one tagged block after a closed `<think>`; padding and hedging do not pay.
"""

from __future__ import annotations

import pytest

from atroposlib.envs.reward_fns import final_integer, registry, tagged_answer

PADDING = "<answer>3</answer>" + " filler" * 200


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("<answer>3</answer>", 1.0),
        ("<think>r appears in st-r-awbe-rr-y: 3</think>\n<answer> 3 </answer>", 1.0),
        ("<answer>03</answer>", 1.0),
        ("<answer>2</answer>", 0.0),
        ("<think>it is <answer>3</answer></think><answer>2</answer>", 0.0),  # hidden in thought
        ("<think>counting... <answer>3</answer>", 0.0),  # never left the reasoning
        ("<answer>2</answer> no wait <answer>3</answer>", 0.0),  # a hedge
        ("The answer is 3.", 0.0),  # no tag
        ("", 0.0),
        ("<answer>" + "3" * 300 + "</answer>", 0.0),  # over-long answer
        ("<ANSWER>3</ANSWER>", 1.0),
    ],
)
def test_answer_tag(reply, expected):
    assert registry.create("answer_tag").compute([reply], gold=3) == [expected]


def test_answer_tag_compares_text_case_folded_and_per_completion_golds():
    reward = registry.create("answer_tag")
    assert reward.compute(["<answer>Paris</answer>", "<answer>paris </answer>"], gold="PARIS") == [
        1.0,
        1.0,
    ]
    assert reward.compute(["<answer>1</answer>", "<answer>1</answer>"], gold=[1, 2]) == [1.0, 0.0]


def test_bare_final_integer_for_models_without_tags():
    assert final_integer("3") == 3 and final_integer("it is 2, no, 4") == 4
    assert final_integer("<think>5</think>") is None and final_integer("<think>5") is None
    assert final_integer("") is None and final_integer("7 " * 200) is None  # padded
    assert tagged_answer("<think>x</think><answer>a</answer>") == "a"


THOUGHT = "<think>Option B matches the definition.</think>\n"


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (THOUGHT + "<answer>B</answer>", 1.0),
        (THOUGHT + "<answer>b</answer>", 1.0),
        (THOUGHT + "<answer>(B)</answer>", 1.0),
        (THOUGHT + "<answer>B) Newton</answer>", 1.0),
        (THOUGHT + "<answer>B. Newton</answer>", 1.0),
        (THOUGHT + "<answer>C</answer>", 0.0),
        (THOUGHT + "<answer>B or C</answer>", 0.0),  # several letters: not one letter
        (THOUGHT + "<answer>Both</answer>", 0.0),  # prose starting with B
        (THOUGHT + "<answer>E</answer>", 0.0),  # no option E among four
        ("<think>It is <answer>B</answer></think><answer>C</answer>", 0.0),
        ("<answer>B</answer>", 0.0),  # thinking required
        ("<think></think><answer>B</answer>", 0.0),  # empty thinking
        ("<think>a</think><think>b</think><answer>B</answer>", 0.0),
        ("<think>B is right", 0.0),
        ("", 0.0),
        (THOUGHT + "<answer>B</answer>" + "<answer>C</answer>", 0.0),
        (THOUGHT + "<answer>B" + " because" * 100 + "</answer>", 0.0),  # over-long
    ],
)
def test_choice_letter(reply, expected):
    assert registry.create("choice_letter").compute([reply], gold="B") == [expected]


def test_choice_letter_without_required_thinking():
    reward = registry.create({"type": "choice_letter", "require_thinking": False})
    assert reward.compute(["<answer>B</answer>", "B"], gold="B") == [1.0, 0.0]


ORIGINAL = "Hello, world!"
TARGET = ORIGINAL[::-1]


def test_reversal_similarity_exact_near_and_adversarial():
    reward = registry.create("reversal_similarity")
    tag = "<reversed_text>{}</reversed_text>"
    exact, near, wrong = (
        tag.format(TARGET),
        tag.format(TARGET[:-2]),
        tag.format("zzzzzzzzzzzzz"),
    )
    scores = reward.compute([exact, near, wrong], original=ORIGINAL)
    assert scores[0] == 1.0 and 0.4 < scores[1] < 0.5 and scores[2] == 0.0
    adversarial = [
        TARGET,  # right text, no tag
        f"<think>{tag.format(TARGET)}</think>",  # only in the reasoning
        f"<think>{TARGET}",  # unclosed reasoning
        tag.format(TARGET + " " + TARGET * 3),  # padded past twice the target
        tag.format(""),
        "",
        tag.format(ORIGINAL),  # not reversed: similarity only
    ]
    scores = reward.compute(adversarial, original=ORIGINAL)
    assert scores[:6] == [0.0] * 6 and scores[6] < 0.5


def test_reversal_similarity_bare_format():
    reward = registry.create({"type": "reversal_similarity", "answer_format": "bare"})
    assert reward.compute([TARGET, f"<think>hm</think>{TARGET}", "x"], original=ORIGINAL)[:2] == [
        1.0,
        1.0,
    ]
