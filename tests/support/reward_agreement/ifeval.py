"""Seeded adversarial IFEval cases, and the verdicts of lm-eval's strict and loose modes.

The reference is lm-eval's `test_instruction_following_strict` / `_loose`
(`lm_eval/tasks/ifeval/utils.py`), called on google/IFEval-shaped inputs. Responses are
built from the families where a hand-written grader goes wrong: quoted replies, text
that is lower- or upper-case but not English, dividers at the edges, Markdown headings
as sections, apostrophes, colons and hyphens in word counts, code fences, bare or
lower-case postscripts, empty placeholders, bullets that are bold text, keywords that
are regex syntax, and reasoning blocks before the response.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from atroposlib.envs.reward_fns._ifeval_checks import NEEDS_PUNKT, punkt_installed

ENGLISH = [
    "The river runs past the old mill and into the sea.",
    "It's a long way home: don't forget the map.",
    "Rain fell on the well-kept garden all night.",
    "We can't say whether the bridge will hold.",
    "Note: the meeting starts at nine o'clock.",
    "The cat sat on the mat, and the dog slept by the door.",
    "Bees visit every flower in the meadow before noon.",
]
FOREIGN = [
    "le chat dort sur le canapé pendant que la pluie tombe.",
    "el perro corre por la playa con su dueño cada mañana.",
    "der hund schläft im garten unter dem alten baum.",
    "il gatto mangia il pesce nella cucina della nonna.",
]
KEYWORDS = ["river", "rain", "map", "c++", "a.b", "(note", "garden", "Rain", "cat"]
SPLITTERS = ["Section", "SECTION", "Part", "Chapter"]
MARKERS = ["P.S.", "P.P.S", "p.s."]
END_PHRASES = ["Is there anything else I can help with?", "The end.", "Any other questions?"]
OPTIONS = ["My answer is yes.", "My answer is no.", "My answer is maybe."]
LANGUAGES = ["en", "fr", "es", "de", "it"]
PROMPTS = ["Describe the sea.", "Write a short note about rain."]


@dataclass
class Case:
    """One IFEval item (google/IFEval's columns) and one response to it."""

    instruction_id_list: list[str]
    kwargs: list[dict[str, Any]]
    response: str
    prompt: str = "Describe the sea."
    thinking: str = ""  # a reasoning block put before the response in the completion
    tags: set[str] = field(default_factory=set)

    @property
    def completion(self) -> str:
        if not self.thinking:
            return self.response
        return f"<think>{self.thinking}</think>\n{self.response}"

    def row(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "instruction_id_list": self.instruction_id_list,
            "kwargs": self.kwargs,
        }


def sentences(rng: random.Random, n: int, pool: list[str] = ENGLISH) -> str:
    return " ".join(rng.choice(pool) for _ in range(n))


def paragraphs(rng: random.Random, n: int, divider: str) -> str:
    return divider.join(sentences(rng, rng.randint(1, 2)) for _ in range(n))


def response_for(rng: random.Random, instruction_id: str, kwargs: dict[str, Any]) -> str:
    """A response aimed near the edge of this instruction, one family at a time."""
    body = sentences(rng, rng.randint(1, 3))
    family = instruction_id.split(":")[1]
    if family in ("english_lowercase", "english_capital", "response_language"):
        text = sentences(rng, rng.randint(1, 3), rng.choice([ENGLISH, FOREIGN]))
        return rng.choice([text.lower(), text.upper(), text, text[:12].upper()])
    if family == "quotation":
        return rng.choice([f'"{body}"', f"“{body}”", f"'{body}'", f' "{body}" \n', f'"{body}'])
    if family == "end_checker":
        end = kwargs["end_phrase"]
        return rng.choice(
            [f"{body} {end}", f'"{body} {end}"', f"{body} {end}\n\n", f"{body} {end.lower()}"]
            + [f"{body} {end} Thanks.", f"{body}\n{end}**"]
        )
    if family in ("number_paragraphs", "nth_paragraph_first_word"):
        divider = rng.choice(["\n***\n", "\n\n", " * * * ", "\n***\n\n", "\n---\n"])
        text = paragraphs(rng, rng.randint(1, 4), divider)
        edge = rng.choice(["", "***\n", "\n\n"])
        return rng.choice([text, edge + text, text + edge[::-1]])
    if family == "two_responses":
        a, b = body, sentences(rng, 1)
        return rng.choice([f"{a}\n******\n{b}", f"{a}\n******\n{a}", f"******\n{a}\n******\n{b}"])
    if family == "multiple_sections":
        splitter = kwargs["section_spliter"]
        heading = rng.choice([f"{splitter} {{n}}", f"# {splitter} {{n}}", f"## {splitter} {{n}}:"])
        n = rng.randint(1, 4)
        return "\n".join(f"{heading.format(n=i + 1)}\n{sentences(rng, 1)}" for i in range(n))
    if family == "json_format":
        payload = rng.choice(['{"a": 1}', "[1, 2]", "{'a': 1}", '{"a": }', '"text"'])
        fence = rng.choice(["```json\n{}\n```", "```JSON\n{}\n```", "```\n{}\n```", "{}"])
        return fence.format(payload)
    if family == "number_placeholders":
        holes = ["[name]", "[ ]", "[]", "[[date]]", "[address of the office]"]
        return " ".join([body, *rng.sample(holes, rng.randint(0, 3))])
    if family == "postscript":
        marker = rng.choice([kwargs["postscript_marker"], "P.S.", "PS:", "p.s."])
        return rng.choice([f"{body}\n{marker} more", f"{body} {marker}", f"{body}\n\n{marker}"])
    if family == "number_bullet_lists":
        items = [rng.choice(["* ", "- ", "** ", "-- ", "1. ", "*"]) + "item" for _ in range(4)]
        return "\n".join(rng.sample(items, rng.randint(0, 4)))
    if family == "number_highlighted_sections":
        marks = ["*fast*", "**bold**", "* *", "***both***", "*a*b*", "**"]
        return " ".join([body, *rng.sample(marks, rng.randint(0, 4))])
    if family == "title":
        return rng.choice([f"<<A Title>>\n{body}", f"<< >>\n{body}", f"<<a\nb>>{body}", body])
    if family == "constrained_response":
        return rng.choice(OPTIONS + [f"{OPTIONS[0]} {OPTIONS[1]}", OPTIONS[2].lower(), body])
    if family in ("existence", "forbidden_words", "frequency"):
        words = kwargs.get("keywords") or kwargs.get("forbidden_words") or [kwargs["keyword"]]
        extra = " ".join(rng.choice(words) for _ in range(rng.randint(0, 3)))
        return f"{body} {extra}".strip()
    if family == "repeat_prompt":
        prompt = kwargs["prompt_to_repeat"]
        return rng.choice([f"{prompt} {body}", f"{prompt.upper()} {body}", f"{body} {prompt}"])
    if family == "no_comma":
        return rng.choice([body, body.replace(",", ""), body.replace(",", "，")])
    return body  # word, sentence, letter and capital-word counts: ordinary text


def kwargs_for(rng: random.Random, instruction_id: str) -> dict[str, Any]:
    relation = rng.choice(["less than", "at least"])
    return {
        "keywords:existence": lambda: {"keywords": rng.sample(KEYWORDS, rng.randint(1, 2))},
        "keywords:forbidden_words": lambda: {"forbidden_words": rng.sample(KEYWORDS, 2)},
        "keywords:frequency": lambda: {
            "keyword": rng.choice(KEYWORDS),
            "frequency": rng.randint(1, 3),
            "relation": relation,
        },
        "keywords:letter_frequency": lambda: {
            "letter": rng.choice("aetz"),
            "let_frequency": rng.randint(1, 12),
            "let_relation": relation,
        },
        "language:response_language": lambda: {"language": rng.choice(LANGUAGES)},
        "length_constraints:number_words": lambda: {
            "num_words": rng.randint(5, 40),
            "relation": relation,
        },
        "length_constraints:number_sentences": lambda: {
            "num_sentences": rng.randint(1, 4),
            "relation": relation,
        },
        "length_constraints:number_paragraphs": lambda: {"num_paragraphs": rng.randint(1, 4)},
        "length_constraints:nth_paragraph_first_word": lambda: {
            "num_paragraphs": (total := rng.randint(1, 4)),
            "nth_paragraph": rng.randint(1, total),
            "first_word": rng.choice(["the", "it's", "rain", "note"]),
        },
        "detectable_content:number_placeholders": lambda: {"num_placeholders": rng.randint(1, 3)},
        "detectable_content:postscript": lambda: {"postscript_marker": rng.choice(MARKERS)},
        "detectable_format:number_bullet_lists": lambda: {"num_bullets": rng.randint(1, 4)},
        "detectable_format:number_highlighted_sections": lambda: {
            "num_highlights": rng.randint(1, 3)
        },
        "detectable_format:multiple_sections": lambda: {
            "section_spliter": rng.choice(SPLITTERS),
            "num_sections": rng.randint(1, 4),
        },
        "combination:repeat_prompt": lambda: {"prompt_to_repeat": rng.choice(PROMPTS)},
        "startend:end_checker": lambda: {"end_phrase": rng.choice(END_PHRASES)},
        "change_case:capital_word_frequency": lambda: {
            "capital_frequency": rng.randint(1, 5),
            "capital_relation": relation,
        },
    }.get(instruction_id, dict)()


# arguments lm-eval replaces with random ones (then grades against those)
RANDOMIZED = [
    ("keywords:existence", {"keywords": []}),
    ("keywords:letter_frequency", {"letter": "é", "let_frequency": 2, "let_relation": "at least"}),
    ("keywords:letter_frequency", {"letter": "e", "let_frequency": 2}),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 5, "first_word": "the"},
    ),
    ("detectable_content:postscript", {}),
    ("startend:end_checker", {}),
]


def gradable_ids() -> list[str]:
    from atroposlib.envs.reward_fns._ifeval_checks import lm_eval_instructions

    ids = sorted(lm_eval_instructions())
    return ids if punkt_installed() else [i for i in ids if i not in NEEDS_PUNKT]


def cases(n: int = 500, seed: int = 27) -> list[Case]:
    """`n` seeded cases: mostly one instruction, some two or three, some with reasoning."""
    rng = random.Random(seed)
    ids = gradable_ids()
    made = []
    for _ in range(n):
        chosen = rng.sample(ids, rng.choice([1, 1, 1, 2, 3]))
        kwargs = [kwargs_for(rng, i) for i in chosen]
        response = response_for(rng, chosen[0], kwargs[0])
        thinking = rng.choice(["", "", "", "rain river map, so"])
        made.append(Case(chosen, kwargs, response, rng.choice(PROMPTS), thinking))
        if rng.random() < 0.05:  # an item lm-eval would grade against random arguments
            instruction_id, bad = rng.choice(RANDOMIZED)
            made.append(Case([instruction_id], [bad], response, tags={"randomized"}))
    return made


def lm_eval_verdicts(case: Case) -> dict[str, list[bool]] | str:
    """lm-eval's strict and loose verdicts on the response, or the error it raised."""
    from lm_eval.tasks.ifeval.utils import (
        InputExample,
        test_instruction_following_loose,
        test_instruction_following_strict,
    )

    example = InputExample(0, case.instruction_id_list, case.prompt, case.kwargs)
    try:
        strict = test_instruction_following_strict(example, case.response)
        loose = test_instruction_following_loose(example, case.response)
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return {"strict": strict.follow_instruction_list, "loose": loose.follow_instruction_list}
