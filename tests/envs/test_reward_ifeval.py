"""The "ifeval" reward: each instruction check, partial credit, and answers that try to cheat."""

from __future__ import annotations

import json

import pytest

from atroposlib.envs.reward_fns import registry
from atroposlib.envs.reward_fns._ifeval_checks import (
    check,
    compare,
    constraints_from_rlvr,
    response_text,
)
from atroposlib.envs.reward_fns.ifeval_reward import IFEvalReward, ifeval_score

# (instruction id, kwargs, a response that follows it, one that does not)
CASES = [
    (
        "keywords:existence",
        {"keywords": ["moss", "river"]},
        "Moss grew by the river.",
        "Mossy rivers.",
    ),
    (
        "keywords:forbidden_words",
        {"forbidden_words": ["cheap"]},
        "It is affordable.",
        "It is CHEAP.",
    ),
    (
        "keywords:frequency",
        {"keyword": "rain", "frequency": 2, "relation": "exactly"},
        "Rain, then rain again.",
        "Rain, rainy, raining.",
    ),
    (
        "keywords:letter_frequency",
        {"letter": "e", "let_frequency": 3, "let_relation": "at least"},
        "Eeek, a bee",
        "a cat",
    ),
    (
        "length_constraints:number_words",
        {"num_words": 5, "relation": "at least"},
        "one two three four five",
        "one two three four",
    ),
    (
        "length_constraints:number_words",
        {"num_words": 5, "relation": "less than"},
        "one two three four",
        "one two three four five",
    ),
    (
        "length_constraints:number_sentences",
        {"num_sentences": 2, "relation": "at most"},
        "It rains. It pours!",
        "One. Two. Three?",
    ),
    (
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 2},
        "First.\n***\nSecond.",
        "First.\n***\n\n***\nSecond.",
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "lava"},
        "Volcanoes erupt.\n\nLava, hot and red, flows.",
        "Volcanoes erupt.\n\nMagma flows.",
    ),
    (
        "detectable_format:number_bullet_lists",
        {"num_bullets": 2},
        "Reasons:\n* one\n- two",
        "* one\n* two\n* three",
    ),
    ("detectable_format:title", {}, "<<Ode to Trains>>\nChoo.", "<< >>\nChoo."),
    ("detectable_format:json_format", {}, '```json\n{"city": "Lima"}\n```', "city: Lima"),
    (
        "detectable_format:number_highlighted_sections",
        {"num_highlights": 2},
        "*fast* and **cheap**",
        "*fast* and plain",
    ),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "SECTION", "num_sections": 2},
        "SECTION 1\nBoil.\nSECTION 2\nPour.",
        "SECTION 1\nBoil and pour.",
    ),
    (
        "detectable_format:constrained_response",
        {},
        "My answer is no.",
        "My answer is yes. My answer is no.",
    ),
    (
        "detectable_content:postscript",
        {"postscript_marker": "P.S."},
        "Hi.\nP.S. bring cake",
        "Hi. Note the P.S. rule",
    ),
    (
        "detectable_content:number_placeholders",
        {"num_placeholders": 2},
        "At [address] on [date].",
        "At [address] on [].",
    ),
    (
        "startend:end_checker",
        {"end_phrase": "Any other questions?"},
        "Done. Any other questions?",
        "Any other questions? Done.",
    ),
    ("startend:quotation", {}, '"Bread is life."', '"Bread is life.'),
    ("change_case:english_lowercase", {}, "all quiet here.", "all quiet Here."),
    ("change_case:english_capital", {}, "STORM AHEAD!", "STORM Ahead!"),
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "at least"},
        "RUN FAST today",
        "Run FAST today",
    ),
    ("punctuation:no_comma", {}, "No commas here.", "Well, yes."),
    (
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Name a moon."},
        "Name a moon. Io.",
        "Io. Name a moon.",
    ),
    ("combination:two_responses", {}, "Shelly ****** Tank", "Shelly ****** Shelly"),
]


@pytest.mark.parametrize(("instruction", "kwargs", "right", "wrong"), CASES)
def test_each_check_separates_right_from_wrong(instruction, kwargs, right, wrong):
    assert check(instruction, right, kwargs) is True
    assert check(instruction, wrong, kwargs) is False


def test_relations():
    assert compare(5, "at least", 5) and not compare(4, "at least", 5)
    assert compare(5, "at most", 5) and not compare(6, "at most", 5)
    assert compare(4, "less than", 5) and not compare(5, "less than", 5)
    assert compare(33, "around", 30) and not compare(34, "around", 30)
    with pytest.raises(ValueError):
        compare(1, "roughly", 1)


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
            [("keywords:existence", {"keywords": ["river"]})],
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


def test_formatting_tricks():
    # keywords must be whole words: "concatenate" does not contain the keyword "cat"
    assert not check("keywords:existence", "we concatenate", {"keywords": ["cat"]})
    # a full-width comma is still a comma
    assert not check("punctuation:no_comma", "yes，no", {})
    # a title needs text between the brackets, on one line
    assert not check("detectable_format:title", "<<\n>>", {})
    # horizontal rules are not bullets
    assert not check("detectable_format:number_bullet_lists", "***\n---", {"num_bullets": 2})
    # no letters at all is neither lowercase nor uppercase
    assert not check("change_case:english_lowercase", "123 !!!", {})


def test_over_long_output_is_judged_on_all_of_it():
    row = {
        "instruction_id_list": ["length_constraints:number_words"],
        "kwargs": [{"num_words": 50, "relation": "at most"}],
    }
    long_text = "word " * 20000
    assert IFEvalReward()([long_text, "word " * 50], **row) == [0.0, 1.0]


def test_unknown_instruction_is_an_error_not_a_zero():
    reward = IFEvalReward()
    with pytest.raises(KeyError):
        reward.compute(["x"], instruction_id_list=["language:response_language"], kwargs=[{}])
    assert reward(["x"], instruction_id_list=["no:such"], kwargs=[{}]) == [0.0]  # __call__ logs
