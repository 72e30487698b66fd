"""Verifiable instruction checks (IFEval's instruction ids), used by the "ifeval" reward.

Design decisions:

- **One vocabulary.** Checks are keyed by Google's IFEval instruction ids
  (`punctuation:no_comma`, `length_constraints:number_words`, ...) and take IFEval's
  kwarg names (`num_words`, `relation`, ...). allenai/RLVR-IFeval rows, which name a
  verifier function (`"func_name": "validate_word_constraint"`) and its arguments, are
  translated into the same ids by `constraints_from_rlvr`, so both hub shapes are graded
  by the same code.
- **Stricter where the lenient reading is gameable.** Keywords match whole words
  ("cat" is not found in "concatenate"); `no_comma` also refuses the full-width comma;
  a constrained response must name exactly one of its options; a postscript must start
  a line; empty paragraphs, bullets or sections do not count.
- **Relations** are IFEval's "less than" / "at least" plus "at most", "more than",
  "exactly" and "around" (within 10%, at least 1), which RLVR-IFeval uses.
- `language:response_language` needs a language detector the project does not ship; it
  is listed in `UNSUPPORTED` so loaders can skip such rows instead of mis-grading them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

Check = Callable[..., bool]

WORD = re.compile(r"\w+(?:['’-]\w+)*")
SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)")
THINK_OPEN = re.compile(r"<think>", re.IGNORECASE)
THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)
UNSUPPORTED = {"language:response_language"}
CONSTRAINED_OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


def response_text(completion: str) -> str:
    """What the constraints are checked on: the text after the reasoning block.

    An unclosed `<think>` means the model never left its reasoning: there is no
    response, so nothing written in the reasoning can satisfy a constraint.
    """
    closes = list(THINK_CLOSE.finditer(completion))
    if closes:
        return completion[closes[-1].end() :].strip()
    if THINK_OPEN.search(completion):
        return ""
    return completion.strip()


def compare(count: int, relation: str | None, target: int) -> bool:
    """`count <relation> target` for IFEval's and RLVR-IFeval's relation words."""
    relation = (relation or "exactly").strip().lower()
    if relation == "at least":
        return count >= target
    if relation == "at most":
        return count <= target
    if relation == "less than":
        return count < target
    if relation == "more than":
        return count > target
    if relation == "around":
        return abs(count - target) <= max(1, round(target * 0.1))
    if relation in ("exactly", "equal to", "=="):
        return count == target
    raise ValueError(f"unknown relation {relation!r}")


def words(text: str) -> list[str]:
    return WORD.findall(text)


def _whole_word(term: str) -> re.Pattern[str]:
    return re.compile(rf"(?<!\w){re.escape(term.strip())}(?!\w)", re.IGNORECASE)


def keywords_existence(text: str, keywords: list[str]) -> bool:
    return bool(keywords) and all(_whole_word(k).search(text) for k in keywords)


def keywords_forbidden(text: str, forbidden_words: list[str]) -> bool:
    return not any(_whole_word(k).search(text) for k in forbidden_words)


def keywords_frequency(text: str, keyword: str, frequency: int, relation: str = "") -> bool:
    return compare(len(_whole_word(keyword).findall(text)), relation, int(frequency))


def letter_frequency(text: str, letter: str, let_frequency: int, let_relation: str = "") -> bool:
    if len(letter) != 1:
        return False
    return compare(text.lower().count(letter.lower()), let_relation, int(let_frequency))


def number_words(text: str, num_words: int, relation: str) -> bool:
    return compare(len(words(text)), relation, int(num_words))


def number_sentences(text: str, num_sentences: int, relation: str) -> bool:
    pieces = [p for p in SENTENCE_END.split(text) if words(p)]
    return compare(len(pieces), relation, int(num_sentences))


def number_paragraphs(text: str, num_paragraphs: int) -> bool:
    """Paragraphs separated by the markdown divider `***` (IFEval's rule); none empty."""
    parts = re.split(r"\s?\*\s?\*\s?\*\s?", text)
    return all(p.strip() for p in parts) and len(parts) == int(num_paragraphs)


def nth_paragraph_first_word(
    text: str, num_paragraphs: int, nth_paragraph: int, first_word: str
) -> bool:
    """Exactly `num_paragraphs` blank-line separated paragraphs; the nth starts with a word."""
    parts = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    nth = int(nth_paragraph)
    if len(parts) != int(num_paragraphs) or not 1 <= nth <= len(parts):
        return False
    found = words(parts[nth - 1])
    return bool(found) and found[0].lower() == first_word.strip().lower()


def number_bullets(text: str, num_bullets: int) -> bool:
    bullets = re.findall(r"^\s*(?:\*(?!\*)|-(?!-))\s*\S.*$", text, re.MULTILINE)
    return len(bullets) == int(num_bullets)


def title(text: str) -> bool:
    return any(t.strip() for t in re.findall(r"<<([^\n]+?)>>", text))


def json_format(text: str) -> bool:
    body = text.strip()
    fenced = re.fullmatch(r"```(?:json|JSON)?\s*\n?(.*?)\n?```", body, re.DOTALL)
    if fenced:
        body = fenced.group(1)
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


def highlighted_sections(text: str, num_highlights: int) -> bool:
    single = re.findall(r"(?<!\*)\*([^\n*]+)\*(?!\*)", text)
    double = re.findall(r"\*\*([^\n*]+)\*\*", text)
    return sum(1 for h in single + double if h.strip()) >= int(num_highlights)


def multiple_sections(text: str, section_spliter: str, num_sections: int) -> bool:
    marker = re.compile(rf"(?:^|\n)\s*{re.escape(section_spliter.strip())}\s*\d+", re.IGNORECASE)
    parts = marker.split(text)[1:]
    return sum(1 for p in parts if p.strip()) >= int(num_sections)


def constrained_response(text: str, options: list[str] | str | None = None) -> bool:
    if isinstance(options, str):  # RLVR-IFeval writes the options as one string
        options = re.findall(r"['\"]([^'\"]+)['\"]", options) or [options]
    named = {o for o in (options or CONSTRAINED_OPTIONS) if o.strip().lower() in text.lower()}
    return len(named) == 1


def postscript(text: str, postscript_marker: str) -> bool:
    marker = re.escape(postscript_marker.strip())
    return bool(re.search(rf"^\s*{marker}\s*\S", text, re.MULTILINE | re.IGNORECASE))


def number_placeholders(text: str, num_placeholders: int) -> bool:
    found = [p for p in re.findall(r"\[([^\[\]\n]+)\]", text) if p.strip()]
    return len(found) >= int(num_placeholders)


def end_checker(text: str, end_phrase: str) -> bool:
    return text.strip().lower().endswith(end_phrase.strip().lower())


def start_checker(text: str, start_phrase: str) -> bool:
    return text.strip().lower().startswith(start_phrase.strip().lower())


def quotation(text: str) -> bool:
    body = text.strip()
    return len(body) > 1 and body[0] == '"' and body[-1] == '"'


def english_lowercase(text: str) -> bool:
    return text.islower()


def english_capital(text: str) -> bool:
    return text.isupper()


def capital_word_frequency(text: str, capital_frequency: int, capital_relation: str) -> bool:
    capitals = [w for w in words(text) if w.isupper()]
    return compare(len(capitals), capital_relation, int(capital_frequency))


def no_comma(text: str) -> bool:
    return "," not in text and "，" not in text


def repeat_prompt(text: str, prompt_to_repeat: str) -> bool:
    return start_checker(" ".join(text.split()), " ".join(prompt_to_repeat.split()))


def two_responses(text: str) -> bool:
    parts = [p.strip() for p in text.split("******")]
    return len(parts) == 2 and all(parts) and parts[0] != parts[1]


CHECKS: dict[str, Check] = {
    "keywords:existence": keywords_existence,
    "keywords:forbidden_words": keywords_forbidden,
    "keywords:frequency": keywords_frequency,
    "keywords:letter_frequency": letter_frequency,
    "length_constraints:number_words": number_words,
    "length_constraints:number_sentences": number_sentences,
    "length_constraints:number_paragraphs": number_paragraphs,
    "length_constraints:nth_paragraph_first_word": nth_paragraph_first_word,
    "detectable_format:number_bullet_lists": number_bullets,
    "detectable_format:title": title,
    "detectable_format:json_format": json_format,
    "detectable_format:number_highlighted_sections": highlighted_sections,
    "detectable_format:multiple_sections": multiple_sections,
    "detectable_format:constrained_response": constrained_response,
    "detectable_content:postscript": postscript,
    "detectable_content:number_placeholders": number_placeholders,
    "startend:end_checker": end_checker,
    "startend:start_checker": start_checker,
    "startend:quotation": quotation,
    "change_case:english_lowercase": english_lowercase,
    "change_case:english_capital": english_capital,
    "change_case:capital_word_frequency": capital_word_frequency,
    "punctuation:no_comma": no_comma,
    "combination:repeat_prompt": repeat_prompt,
    "combination:two_responses": two_responses,
}

# RLVR-IFeval verifier name -> (IFEval id, {IFEval kwarg: RLVR argument or a constant})
_RLVR: dict[str, tuple[str, dict[str, Any]]] = {
    "verify_keywords": ("keywords:existence", {"keywords": "keyword_list"}),
    "validate_forbidden_words": (
        "keywords:forbidden_words",
        {"forbidden_words": "forbidden_words"},
    ),
    "verify_keyword_frequency": (
        "keywords:frequency",
        {"keyword": "word", "frequency": "N", "relation": ("exactly",)},
    ),
    "verify_letter_frequency": (
        "keywords:letter_frequency",
        {"letter": "letter", "let_frequency": "N", "let_relation": ("exactly",)},
    ),
    "validate_response_language": ("language:response_language", {"language": "language"}),
    "verify_paragraph_count": ("length_constraints:number_paragraphs", {"num_paragraphs": "N"}),
    "validate_word_constraint": (
        "length_constraints:number_words",
        {"num_words": "N", "relation": "quantifier"},
    ),
    "verify_sentence_constraint": (
        "length_constraints:number_sentences",
        {"num_sentences": "N", "relation": "quantifier"},
    ),
    "validate_paragraphs": (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": "N", "nth_paragraph": "i", "first_word": "first_word"},
    ),
    "verify_postscript": (
        "detectable_content:postscript",
        {"postscript_marker": "postscript_marker"},
    ),
    "validate_placeholders": ("detectable_content:number_placeholders", {"num_placeholders": "N"}),
    "verify_bullet_points": ("detectable_format:number_bullet_lists", {"num_bullets": "N"}),
    "validate_title": ("detectable_format:title", {}),
    "validate_choice": ("detectable_format:constrained_response", {"options": "options"}),
    "validate_highlighted_sections": (
        "detectable_format:number_highlighted_sections",
        {"num_highlights": "N"},
    ),
    "validate_sections": (
        "detectable_format:multiple_sections",
        {"section_spliter": "section_splitter", "num_sections": "N"},
    ),
    "validate_json_format": ("detectable_format:json_format", {}),
    "validate_repeat_prompt": (
        "combination:repeat_prompt",
        {"prompt_to_repeat": "original_prompt"},
    ),
    "validate_two_responses": ("combination:two_responses", {}),
    "validate_uppercase": ("change_case:english_capital", {}),
    "validate_lowercase": ("change_case:english_lowercase", {}),
    "validate_frequency_capital_words": (
        "change_case:capital_word_frequency",
        {"capital_frequency": "N", "capital_relation": "quantifier"},
    ),
    "validate_end": ("startend:end_checker", {"end_phrase": "end_phrase"}),
    "validate_quotation": ("startend:quotation", {}),
    "validate_no_commas": ("punctuation:no_comma", {}),
}


def constraints_from_rlvr(ground_truth: str | dict[str, Any]) -> list[tuple[str, dict]]:
    """An RLVR-IFeval `ground_truth` (JSON with `func_name` and arguments) as IFEval ids."""
    truth = json.loads(ground_truth) if isinstance(ground_truth, str) else dict(ground_truth)
    name = truth.get("func_name")
    if name not in _RLVR:
        raise ValueError(f"unknown RLVR-IFeval verifier {name!r}")
    instruction_id, fields = _RLVR[name]
    kwargs = {}
    for key, source in fields.items():
        value = source[0] if isinstance(source, tuple) else truth.get(source)
        if value is not None:
            kwargs[key] = value
    return [(instruction_id, kwargs)]


def clean_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """IFEval's hub rows give every kwarg for every instruction, unused ones None."""
    return {k: v for k, v in (kwargs or {}).items() if v is not None}


def check(instruction_id: str, response: str, kwargs: dict[str, Any] | None = None) -> bool:
    """Does `response` (already stripped of reasoning) follow one instruction?"""
    if instruction_id not in CHECKS:
        raise KeyError(f"no check for instruction {instruction_id!r}")
    return bool(CHECKS[instruction_id](response, **clean_kwargs(kwargs)))
