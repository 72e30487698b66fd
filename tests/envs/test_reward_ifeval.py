"""The "ifeval" reward: lm-eval's IFEval verdicts, partial credit, and what it refuses."""

from __future__ import annotations

import json
import logging

import pytest

from atroposlib.envs.reward_fns import registry
from atroposlib.envs.reward_fns._ifeval_checks import (
    NEEDS_PUNKT,
    UnsupportedInstruction,
    bounds,
    check,
    compile_constraint,
    constraints_from_rlvr,
    punkt_installed,
    response_text,
)
from atroposlib.envs.reward_fns.ifeval_reward import IFEvalReward, ifeval_score
from tests.support.reward_agreement.compare import ifeval_agreement


def test_verdicts_agree_with_lm_evals_ifeval_on_hundreds_of_adversarial_cases():
    """Every disagreement is fixed or documented (tests/support/reward_agreement)."""
    agreement = ifeval_agreement(n=500, seed=27)
    assert agreement.cases >= 500
    assert agreement.disagreements == []
    assert agreement.agreed >= 0.9 * agreement.cases


def test_more_relations_are_bounds_on_lm_evals_own_count():
    from lm_eval.tasks.ifeval.instructions_util import count_words

    assert bounds("at most", 5) == [("less than", 6)]
    assert bounds("around", 30) == [("at least", 27), ("less than", 34)]
    for n_words in range(0, 14):
        text = " ".join(["it's"] * n_words)  # lm-eval counts "it's" as two words
        count = count_words(text)
        for relation, holds in [
            ("at most", count <= 6),
            ("more than", count > 6),
            ("exactly", count == 6),
            ("around", abs(count - 6) <= 1),
        ]:
            kwargs = {"num_words": 6, "relation": relation}
            assert check("length_constraints:number_words", text, kwargs) == (
                holds and bool(text)
            ), (text, relation)
    with pytest.raises(UnsupportedInstruction, match="unknown relation"):
        bounds("roughly", 1)


def test_a_count_at_or_below_zero_is_graded_as_written():
    """lm-eval would draw a random count; "at least 0" always holds, "less than 0" never."""
    for relation, expected in [("at least", True), ("less than", False), ("exactly", False)]:
        kwargs = {"keyword": "rain", "frequency": 0, "relation": relation}
        assert check("keywords:frequency", "Rain again.", kwargs) is expected


@pytest.mark.parametrize(
    ("instruction_id", "kwargs"),
    [
        ("keywords:existence", {"keywords": None}),
        (
            "keywords:letter_frequency",
            {"letter": "ß", "let_frequency": 2, "let_relation": "at least"},
        ),
        ("detectable_content:postscript", {}),
        (
            "length_constraints:nth_paragraph_first_word",
            {"num_paragraphs": 2, "nth_paragraph": 3, "first_word": "a"},
        ),
    ],
)
def test_an_argument_lm_eval_would_randomize_is_refused_by_name(instruction_id, kwargs):
    with pytest.raises(UnsupportedInstruction, match="random"):
        compile_constraint(instruction_id, kwargs)


def test_sentence_counts_need_punkt_data_or_say_how_to_get_it():
    kwargs = {"num_sentences": 2, "relation": "at least"}
    if punkt_installed():
        assert check("length_constraints:number_sentences", "One. Two.", kwargs)
        return
    for instruction_id in NEEDS_PUNKT:
        with pytest.raises(UnsupportedInstruction, match="nltk.downloader punkt_tab"):
            compile_constraint(instruction_id, kwargs)


def test_an_item_that_cannot_be_graded_scores_zero_and_is_logged_once(caplog):
    reward = IFEvalReward()
    row = {"instruction_id_list": ["no:such_in_this_test"], "kwargs": [{}]}  # logged nowhere else
    with caplog.at_level(logging.WARNING):
        assert reward.compute(["x", "y"], **row) == [0.0, 0.0]
        assert reward(["x"], **row) == [0.0]
    assert [r.message for r in caplog.records].count(
        "ifeval: this item cannot be graded, scoring 0.0: "
        "no IFEval instruction 'no:such_in_this_test'"
    ) == 1


def test_one_completion_whose_check_raises_leaves_the_rest_alone():
    row = {"instruction_id_list": ["keywords:existence"], "kwargs": [{"keywords": ["(rain"]}]}
    row_ok = {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}
    completions = ["(rain falls", None, {"role": "assistant", "content": "a, b"}, 7, "fine"]
    assert IFEvalReward().compute(completions, **row) == [0.0] * 5  # lm-eval's re.error
    assert IFEvalReward().compute(completions, **row_ok) == [1.0, 0.0, 0.0, 0.0, 1.0]


IFEVAL_ROW = {
    "key": 7,
    "prompt": "Write about rain.",
    "instruction_id_list": ["punctuation:no_comma", "keywords:existence", "startend:end_checker"],
    # the hub gives every kwarg to every instruction, unused ones None
    "kwargs": [
        {"keywords": None, "end_phrase": None},
        {"keywords": ["rain"], "end_phrase": None},
        {"keywords": None, "end_phrase": "The end."},
    ],
}


def test_fraction_met_is_the_score():
    reward = registry.create("ifeval")
    scores = reward(
        [
            "Rain falls softly. The end.",  # all three
            "Rain falls, softly. The end.",  # a comma
            "Snow, snow everywhere.",  # only... none: comma, no rain, wrong end
            "Rain falls softly.",  # no end phrase
        ],
        **IFEVAL_ROW,
    )
    assert scores == pytest.approx([1.0, 2 / 3, 0.0, 2 / 3])


def test_all_or_nothing_and_bonus():
    strict = IFEvalReward(all_or_nothing=True)
    bonus = IFEvalReward(all_met_bonus=0.5)
    texts = ["Rain falls softly. The end.", "Rain falls softly."]
    assert strict(texts, **IFEVAL_ROW) == [1.0, 0.0]
    assert bonus(texts, **IFEVAL_ROW) == pytest.approx([1.5, 2 / 3])


def test_rlvr_ground_truth_is_translated():
    truth = {"func_name": "validate_word_constraint", "N": 3, "quantifier": "at most"}
    for key in ("end_phrase", "keyword_list", "letter"):
        truth[key] = None
    assert constraints_from_rlvr(json.dumps(truth)) == [
        ("length_constraints:number_words", {"num_words": 3, "relation": "at most"})
    ]
    reward = IFEvalReward()
    assert reward(["just three words", "now four words here"], ground_truth=json.dumps(truth)) == [
        1.0,
        0.0,
    ]
    with pytest.raises(ValueError):
        constraints_from_rlvr({"func_name": "no_such_verifier"})


def test_answer_hidden_in_reasoning_does_not_count():
    row = {"instruction_id_list": ["keywords:existence"], "kwargs": [{"keywords": ["river"]}]}
    assert (
        ifeval_score(
            "<think>mention the river</think>A calm lake.",
            [compile_constraint("keywords:existence", {"keywords": ["river"]})],
        )
        == 0.0
    )
    reward = IFEvalReward()
    assert reward(
        ["<think>the river, the river", "<think>plan</think>The river bends."], **row
    ) == [
        0.0,
        1.0,
    ]
    assert response_text("<think>a</think>b<think>c</think> d ") == "d"


def test_empty_output_meets_nothing_even_vacuous_rules():
    row = {
        "instruction_id_list": ["punctuation:no_comma", "keywords:forbidden_words"],
        "kwargs": [{}, {"forbidden_words": ["x"]}],
    }
    assert IFEvalReward()(["", "   ", "<think>ok</think>"], **row) == [0.0, 0.0, 0.0]
