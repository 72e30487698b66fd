"""Scores of the built-in reward functions on concrete completions.

Each expected number is what upstream Atropos's implementation of the same reward gives
(worked out from its code); comments show the arithmetic where it is not obvious.
"""

from __future__ import annotations

import sys
import types

import pytest

from atroposlib.envs.reward_fns import registry
from atroposlib.envs.reward_fns.accuracy_reward import AccuracyReward, accuracy_reward
from atroposlib.envs.reward_fns.cascading_r1_math_reward import (
    cascading_r1_math_reward,
    get_completion_content,
)
from atroposlib.envs.reward_fns.cascading_r1_math_reward import (
    format_reward as think_format_reward,
)
from atroposlib.envs.reward_fns.chandas_meter_reward import ChandasMeterReward, iast_to_slp1
from atroposlib.envs.reward_fns.crossword_format_reward import CrosswordFormatReward
from atroposlib.envs.reward_fns.format_reward import FormatReward, format_reward
from atroposlib.envs.reward_fns.r1_reward import (
    AccuracyXReward,
    FormatReasoningReward,
    R1Reward,
    parse_reasoning_response,
)
from atroposlib.envs.reward_fns.reasoning_steps_reward import ReasoningStepsReward
from atroposlib.envs.reward_fns.repetition_penalty_reward import RepetitionPenaltyReward

# --- accuracy -------------------------------------------------------------------------


def test_accuracy_boxed_answer_after_think_block():
    reward = registry.create("accuracy")
    completions = [
        "<think>2+2=4</think>The answer is \\boxed{4}",
        "The answer is \\boxed{5}",
        "\\boxed{\\frac{1}{2}}",
    ]
    assert reward(completions, solution=["4", "4", "0.5"]) == [1.0, 0.0, 1.0]


def test_accuracy_gsm8k_style_answers_fall_back_to_numbers():
    reward = AccuracyReward()
    # No LaTeX to parse: the number after "####" is compared with the gold value.
    assert reward.compute(["#### 42"], solution="42") == [1.0]
    assert reward.compute(["#### 1234"], solution="1,234") == [1.0]
    # The fallback reads digits and dots only: "1,234" is read as 1.
    assert reward.compute(["so #### 1,234"], solution="1234") == [0.0]
    # A GSM8K gold answer is reduced to what follows "####".
    assert reward.compute(["\\boxed{4}"], solution="Two plus two.\n#### 4") == [1.0]
    assert reward.compute(["#### 4.05"], solution="4") == [0.0]
    assert AccuracyReward(tolerance=0.1).compute(["#### 4.05"], solution="4") == [1.0]


def test_accuracy_without_a_parsable_answer_scores_zero():
    reward = AccuracyReward()
    assert reward.compute(["The answer is 4", "$4$", "\\boxed{x}", ""], solution="4") == [0.0] * 4
    assert reward.compute(["\\boxed{4}", "\\boxed{4}"]) == [0.0, 0.0]


def test_accuracy_too_many_boxed_after_think_scores_zero():
    reward = AccuracyReward()
    assert reward.compute(["</think>" + "\\boxed{4}" * 6], solution="4") == [1.0]
    assert reward.compute(["</think>" + "\\boxed{4}" * 7], solution="4") == [0.0]
    # The limit only applies to text after a think block.
    assert reward.compute(["\\boxed{4}" * 7], solution="4") == [1.0]
    assert AccuracyReward(max_boxed_threshold=1).compute(
        ["<think>x</think>\\boxed{4}\\boxed{4}"], solution="4"
    ) == [0.0]


def test_accuracy_judges_only_the_text_after_think_unless_disabled():
    completion = ["<think>\\boxed{1}</think>\\boxed{4}"]
    assert AccuracyReward().compute(completion, solution="4") == [1.0]
    assert AccuracyReward(split_on_think_tag=False).compute(completion, solution="4") == [0.0]


def test_accuracy_ground_truth_wins_and_lists_pair_up():
    reward = AccuracyReward()
    pair = ["\\boxed{4}", "\\boxed{5}"]
    assert reward.compute(pair, solution="5", ground_truth="4") == [1.0, 0.0]
    assert reward.compute(pair, solution=["4", "5"]) == [1.0, 1.0]
    assert reward.compute(pair, solution=4) == [1.0, 0.0]
    assert AccuracyReward(weight=2.5)(pair, solution="4") == [2.5, 0.0]
    assert accuracy_reward(pair, ground_truth="5") == [0.0, 1.0]


def test_accuracy_reads_chat_shaped_completions():
    completions = [
        {"role": "assistant", "content": "\\boxed{4}"},
        {"role": "user", "content": "\\boxed{4}"},
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\\boxed{4}"}],
        {"message": {"role": "assistant", "content": "\\boxed{4}"}},
    ]
    assert AccuracyReward().compute(completions, solution="4") == [1.0, 0.0, 1.0, 1.0]


# --- cascading_r1_math ----------------------------------------------------------------


def test_cascading_adds_format_bonus_only_when_correct():
    completions = [
        "<think>2+2</think>\\boxed{4}",  # correct and well formatted: 1.0 + 0.5
        "\\boxed{4}",  # correct, no think block: 1.0
        "<think>2+2</think>\\boxed{5}",  # wrong: no bonus either
        "<think>a</think><b>\\boxed{4}",  # correct, but a stray tag breaks the format
    ]
    assert cascading_r1_math_reward(completions, "4") == [1.5, 1.0, 0.0, 1.0]


def test_cascading_reads_any_dict_with_content():
    completions = [
        {"content": "<think>x</think>#### 4"},
        {"role": "user", "content": "<think>x</think>#### 4"},
    ]
    assert cascading_r1_math_reward(completions, ["4", "4"]) == [1.5, 1.5]
    assert get_completion_content([{"content": "first"}, {"content": "second"}]) == "first"
    assert get_completion_content(7) == "7"


def test_cascading_think_format_reward():
    assert think_format_reward(["<think>x</think>y", "<think>x</think><y>", "y"]) == [0.5, 0, 0]
    assert think_format_reward(["<think>x</think>y"], reward_value=2.0) == [2.0]


# --- format ---------------------------------------------------------------------------


def test_format_any_tag_case_insensitive_across_lines():
    completions = [
        "<think>x</think>",
        "<ANSWER>4</ANSWER>",
        "<answer>4",
        "no tags",
        "<think>\n</think>",
    ]
    assert registry.create("format").compute(completions) == [1.0, 1.0, 0.0, 0.0, 1.0]


def test_format_options():
    both = ["<think>x</think><answer>4</answer>", "<think>x</think>"]
    assert FormatReward(require_all_tags=True).compute(both) == [1.0, 0.0]
    assert FormatReward(case_sensitive=True).compute(["<THINK>x</THINK>", "<think>x</think>"]) == [
        0.0,
        1.0,
    ]
    assert FormatReward(preferred_tags=["reasoning"]).compute(
        both + ["<reasoning>r</reasoning>"]
    ) == [
        0.0,
        0.0,
        1.0,
    ]
    assert format_reward(["<answer>1</answer>", "<think>t</think>"], preferred_tags=["answer"]) == [
        1.0,
        0.0,
    ]


# --- r1 -------------------------------------------------------------------------------


def test_r1_format_and_accuracy_parts():
    completions = [
        "<think>2+2=4</think>The answer is 4",  # 0.5 * 1 + 1.0 * 1
        "The answer is 4",  # no think block: 0 + 1
        "<think>x</think>no idea",  # 0.5 + 0
        "<think>a</think><think>b</think>4",  # two think blocks: 0 + 1 (whole text searched)
        "<think>\n</think>4",  # empty thinking: 0 + 1
    ]
    assert registry.create("r1").compute(completions, solution="4") == [1.5, 1.0, 0.5, 1.0, 1.0]


def test_r1_weights_and_missing_solution():
    assert R1Reward(format_weight=2, accuracy_weight=3)(
        ["<think>x</think>FOUR"], solution="four"
    ) == [5.0]
    assert R1Reward(weight=2)(["<think>x</think>4"], solution="4") == [3.0]
    assert R1Reward().compute(["<think>x</think>4"]) == [0.5]
    assert registry.create({"type": "r1_reward", "params": {"format_weight": 0.25}, "weight": 2})(
        ["<think>x</think>4"], solution="4"
    ) == [2.5]


def test_r1_parts_and_parser():
    assert AccuracyXReward(case_sensitive=True).compute(
        ["<think>x</think>Four"], solution="four"
    ) == [0.0]
    assert AccuracyXReward(exact_match=True).compute(
        ["<think>x</think>4", "<think>x</think>is 4"], solution="4"
    ) == [1.0, 0.0]
    assert AccuracyXReward().compute(["4"]) == [0.0]
    assert FormatReasoningReward().compute(["<think>x</think>y", "<think>x</think>"]) == [0.5, 0.0]
    assert FormatReasoningReward(require_response=False).compute(["<think>x</think>"]) == [0.5]
    assert FormatReasoningReward(require_thinking=False).compute(["no tags"]) == [0.5]
    # Several think blocks leave no thinking content, so allowing them is not enough.
    multiple = ["<think>a</think><think>b</think>4"]
    assert FormatReasoningReward(allow_multiple_thinking=True).compute(multiple) == [0.0]
    assert parse_reasoning_response("<think> a b </think>  resp ") == {
        "thinking_content": "a b",
        "response": "resp",
        "multiple_thinking": False,
    }
    assert parse_reasoning_response(multiple[0])["multiple_thinking"] is True
    assert parse_reasoning_response(5)["response"] == "5"


# --- reasoning_steps --------------------------------------------------------------------


def test_reasoning_steps_scores_each_marker_kind():
    completions = [
        "Step 1: read. Step 2: add. Step 3: done.",  # 3 steps: 0.5
        "1. a\n2. b\n3. c",  # 3 list numbers: 0.5
        "- x\n* y",  # 2 of 3 bullets: 2/3 * 0.4
        "First, add. Then divide. Finally done.",  # 3 transitions: 0.3
        "4",
        "one two three four five six seven eight nine ten eleven",  # > 10 words: 0.1
        "Step 1: x\n1. a\n2. b\n3. c\n- p\n- q\n- r\nFirst then finally now more words",  # capped
    ]
    scores = registry.create("reasoning_steps").compute(completions)
    assert scores == pytest.approx([0.5, 0.5, 0.8 / 3, 0.3, 0.0, 0.1, 1.0])


def test_reasoning_steps_options():
    reward = ReasoningStepsReward(
        min_steps=1, base_score=0.5, min_words=2, pattern_weights={"numbered_steps": 0.2}
    )
    assert reward.compute(["Step 1: go there", "x"]) == pytest.approx([0.7, 0.0])


# --- repetition_penalty -----------------------------------------------------------------

STUTTER = (
    "I think think think that this answer answer answer is correct. Really it is correct and fine."
)


def test_repetition_penalty_short_and_varied_texts():
    reward = registry.create("repetition_penalty")
    varied = "Alpha beta gamma delta epsilon. Zeta eta theta iota kappa. Lambda mu nu xi omicron."
    one_sentence = "Only one sentence here but it has plenty of words in it"
    assert reward.compute(["short", one_sentence, varied]) == [-0.1, -0.1, 0.0]
    custom = RepetitionPenaltyReward(short_text_penalty=-0.3, min_words=3)
    assert custom.compute(["a b c d", "Hi there. You."]) == [-0.3, 0.0]


def test_repetition_penalty_repeated_sentences():
    cat = "The cat sat on the mat. The cat sat on the mat. The cat sat on the mat."
    # Two repeats among three sentences: -0.6 - 0.4 * 2/3.
    assert RepetitionPenaltyReward().compute([cat]) == pytest.approx([-0.6 - 0.4 * 2 / 3])
    store = "Go to the store now. Go to the store now. Then come back home."
    custom = RepetitionPenaltyReward(paragraph_repetition_base_penalty=-0.5)
    assert custom.compute([store]) == pytest.approx([-0.5 - 0.4 / 3])


def test_repetition_penalty_word_stutter_and_opening_rates():
    # 17 words; "think" and "answer" three times each: word rate 4/17 (weight 0.3) and four
    # stutters, 4/17 (weight 0.6); score 0.9 * 4/17, scaled above the 0.05 threshold.
    score = 0.9 * 4 / 17
    assert RepetitionPenaltyReward().compute([STUTTER]) == pytest.approx([-(score - 0.05) / 0.95])
    assert RepetitionPenaltyReward(threshold=0.5).compute([STUTTER]) == [0.0]
    heavy = RepetitionPenaltyReward(component_weights={"consecutive_repetition": 3.0})
    assert heavy.compute([STUTTER]) == pytest.approx([-(3.3 * 4 / 17 - 0.05) / 0.95])
    # "the dog ran" twice more among 16 words (phrase rate 2/16, weight 0.4) and as two
    # repeated sentence openings out of three (2/3, weight 0.5).
    dog = "The dog ran home fast. The dog ran to the park. The dog ran back again."
    dog_score = 0.4 * 2 / 16 + 0.5 * 2 / 3
    assert RepetitionPenaltyReward().compute([dog]) == pytest.approx([-(dog_score - 0.05) / 0.95])


def test_repetition_penalty_is_at_least_a_tenth_once_over_threshold():
    # Score 0.9 * 4/17 = 0.21 is just over a 0.2 threshold: -(0.0118 / 0.8) becomes -0.1.
    assert RepetitionPenaltyReward(threshold=0.2).compute([STUTTER]) == [-0.1]


# --- crossword_format -------------------------------------------------------------------


def test_crossword_format():
    completions = [
        "1-Across: HELLO, 2-Down: WORLD",
        "HELLO WORLD",
        "3-down: cat",
        "Across: abc",
    ]
    assert registry.create("crossword_format").compute(completions) == [1.0, 0.0, 1.0, 0.0]


def test_crossword_invalid_characters_and_options():
    assert CrosswordFormatReward(valid_chars="HELO").compute(
        ["1-Across: HELLO", "2-Down: WORLD"]
    ) == [
        1.0,
        0.0,
    ]
    lenient = CrosswordFormatReward(penalize_invalid_chars=False, valid_chars="A", reward_value=0.5)
    assert lenient.compute(["2-Down: WORLD"]) == [0.5]
    strict = CrosswordFormatReward(format_patterns=[r"^\d+-across: [a-z]+$"])
    assert strict.compute(["1-Across: HELLO", "1-Across: HELLO and more"]) == [1.0, 0.0]


# --- chandas_meter ----------------------------------------------------------------------


def test_iast_to_slp1():
    assert iast_to_slp1("dharmakṣetre kurukṣetre") == "Darmakzetre kurukzetre"
    assert iast_to_slp1("śrī bhagavān uvāca") == "SrI BagavAn uvAca"
    assert iast_to_slp1("ṭhakkura ḍhola aiśvarya saumya") == "Wakkura Qola ESvarya sOmya"


def test_chandas_meter_without_the_classifier_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "chandas", None)  # what an absent package looks like
    reward = registry.create({"type": "chandas_meter", "params": {"meter": "anustubh"}})
    assert isinstance(reward, ChandasMeterReward)
    assert reward.meter == "anustubh"
    with pytest.raises(ImportError, match="'chandas' package"):
        reward.compute(["dharmakṣetre kurukṣetre"])
    assert reward(["dharmakṣetre kurukṣetre", "x"]) == [0.0, 0.0]


class _Verdict:
    def __init__(self, name: str, score: float | None = None) -> None:
        self.name = name
        if score is not None:
            self.score = score


class _Classifier:
    """Stands in for chandas.Classifier, which no published chandas release provides."""

    seen: list[str] = []
    verdicts = {
        "Darma": _Verdict("Tristubh", 0.8),
        "kuru": _Verdict("anustubh", 0.3),
        "kzetra": _Verdict("anustubh", 1.5),
        "uvAca": _Verdict("tristubh"),
        "SrI": _Verdict("jagati"),
    }

    @classmethod
    def from_default_location(cls) -> _Classifier:
        return cls()

    def classify(self, text: str):
        self.seen.append(text)
        if text == "boom":
            raise RuntimeError("classifier failure")
        return self.verdicts.get(text)


def test_chandas_meter_scores_with_a_classifier(monkeypatch):
    fake = types.ModuleType("chandas")
    fake.Classifier = _Classifier
    monkeypatch.setitem(sys.modules, "chandas", fake)
    reward = ChandasMeterReward(weight=2.0)
    texts = ["dharma", "kuru", "kṣetra", "uvāca", "śrī", "unknown", "boom"]
    # Target meter tristubh: a match keeps its score (0.8); a miss turns score s into 1 - s
    # (0.7), or 0.0 above 1; a verdict without a score counts 1.0 for a match and, as in
    # upstream, also 1.0 for a miss (1 - 0); no verdict or an error scores 0.0.
    assert reward.compute(texts) == pytest.approx([0.8, 0.7, 0.0, 1.0, 1.0, 0.0, 0.0])
    assert reward(texts[:2]) == pytest.approx([1.6, 1.4])
    assert _Classifier.seen[:3] == ["Darma", "kuru", "kzetra"]
