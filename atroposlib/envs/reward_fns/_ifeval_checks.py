"""IFEval's instruction checks, as lm-eval defines them, for the "ifeval" reward.

Design decisions:

- **lm-eval is the grader.** Each instruction is checked by lm-eval's own checker
  class (`lm_eval.tasks.ifeval.instructions_registry`), built and called the way lm-eval's
  strict and loose modes call it (`lm_eval/tasks/ifeval/utils.py`), so a score here is
  the score the IFEval benchmark gives. This module only adapts: it reads the item's
  constraints, refuses what lm-eval would grade at random, and adds relations.
- **No random grading.** lm-eval fills a missing or out-of-range argument (no keywords,
  a letter outside a-z, a zero count, a paragraph past the last) with a random one, so
  the verdict would be a coin toss. Each checker is built with lm-eval's `random`
  replaced by one that refuses; a constraint whose build draws a random number is
  refused with `UnsupportedInstruction`.
- **More relations.** lm-eval knows "less than" and "at least". allenai/RLVR-IFeval
  also writes "at most", "more than", "exactly" and "around" (within 10%, at least 1):
  each becomes one or two lm-eval bounds on the same count ("at most N" is "less than
  N+1"), so the counting stays lm-eval's. A bound at or below zero needs no count.
- **Offline.** Importing lm-eval's checkers runs `nltk.download("punkt_tab")`; here the
  download is skipped, so grading never touches the network. The two instructions that
  need nltk's punkt data (`length_constraints:number_sentences`,
  `change_case:capital_word_frequency`) raise `UnsupportedInstruction` with the command
  that installs it until `nltk.data.find("tokenizers/punkt_tab")` finds it; they never
  pass or fail silently.
- **Deterministic language checks.** lm-eval leaves langdetect unseeded, so a short or
  mixed text can be called English on one run and not the next; the seed is fixed at 0.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import re
import threading
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from ._final_answer import after_thinking

LM_EVAL_RELATIONS = ("less than", "at least")
CONSTRAINED_OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")
NEEDS_PUNKT = {"length_constraints:number_sentences", "change_case:capital_word_frequency"}
# instruction id -> (its count argument, its relation argument), in lm-eval's names
COUNTED = {
    "keywords:frequency": ("frequency", "relation"),
    "keywords:letter_frequency": ("let_frequency", "let_relation"),
    "length_constraints:number_words": ("num_words", "relation"),
    "length_constraints:number_sentences": ("num_sentences", "relation"),
    "change_case:capital_word_frequency": ("capital_frequency", "capital_relation"),
}

Constraint = tuple[str, dict[str, Any]]
Check = Callable[[str], bool]


class IFEvalUnavailable(ImportError):
    """lm-eval, whose checkers grade IFEval, is not installed."""


class UnsupportedInstruction(ValueError):
    """A constraint this grader cannot check as lm-eval defines it (the message says why)."""


class _RandomDrawn(Exception):
    """lm-eval drew a random value while building a checker: an argument was unusable."""


class _NoRandom:
    """Stands in for lm-eval's `random` module while a checker is built."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise _RandomDrawn(name)

        return refuse


_BUILDING = threading.Lock()


@functools.cache
def lm_eval_modules() -> tuple[ModuleType, ...]:
    """lm-eval's IFEval modules that draw random arguments: instructions, instructions_util."""
    lm_eval_instructions()
    from lm_eval.tasks.ifeval import instructions, instructions_util

    return instructions, instructions_util


@functools.cache
def lm_eval_instructions() -> dict[str, type]:
    """lm-eval's instruction id -> checker class, imported without any download."""
    try:
        import langdetect
        import nltk
    except ImportError as error:
        raise IFEvalUnavailable(
            f"the ifeval reward needs {error.name}: pip install 'atroposlib[ifeval]'"
        ) from error
    real_download = nltk.download
    nltk.download = lambda *args, **kwargs: False  # lm-eval downloads punkt at import
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # and then says it did
            from lm_eval.tasks.ifeval import instructions_registry
    except ImportError as error:
        raise IFEvalUnavailable(
            "the ifeval reward grades with lm-eval's IFEval checkers: "
            f"pip install 'atroposlib[ifeval]' ({error})"
        ) from error
    finally:
        nltk.download = real_download
    langdetect.DetectorFactory.seed = 0
    return dict(instructions_registry.INSTRUCTION_DICT)


def punkt_installed() -> bool:
    import nltk

    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
    except LookupError:
        return False
    return True


def response_text(completion: str) -> str:
    """What the constraints are checked on: the text after the reasoning block.

    An unclosed `<think>` means the model never left its reasoning: there is no
    response, so nothing written in the reasoning can satisfy a constraint. Without a
    reasoning block the completion is the response, exactly as lm-eval reads it.
    """
    response = after_thinking(completion)
    if response is None:
        return ""
    return response if response is completion else response.strip()


def clean_kwargs(kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """IFEval's hub rows give every kwarg for every instruction, unused ones None."""
    return {k: v for k, v in (kwargs or {}).items() if v is not None}


def bounds(relation: Any, target: Any) -> list[tuple[str, int]]:
    """A relation word and its target as lm-eval bounds on the count, all of which must hold."""
    name = str(relation or "").strip().lower()
    try:
        n = int(target)
    except (TypeError, ValueError) as error:
        raise UnsupportedInstruction(f"the count {target!r} is not an integer") from error
    if name in LM_EVAL_RELATIONS:
        return [(name, n)]
    if name == "at most":
        return [("less than", n + 1)]
    if name == "more than":
        return [("at least", n + 1)]
    if name in ("exactly", "equal to", "=="):
        return [("at least", n), ("less than", n + 1)]
    if name == "around":
        slack = max(1, round(n * 0.1))
        return [("at least", n - slack), ("less than", n + slack + 1)]
    raise UnsupportedInstruction(f"unknown relation {relation!r}")


def lm_eval_check(instruction_id: str, kwargs: dict[str, Any], prompt: str = "") -> Check:
    """lm-eval's checker for one instruction, refused if it would grade at random."""
    checker = lm_eval_instructions()[instruction_id](instruction_id)
    modules = lm_eval_modules()
    with _BUILDING:
        saved = [module.random for module in modules]
        for module in modules:
            # typeshed's ModuleType has __getattr__ but no __setattr__
            module.random = _NoRandom()  # type: ignore[attr-defined]
        try:
            checker.build_description(**kwargs)
            if "prompt" in (checker.get_instruction_args() or {}):  # as lm-eval's utils.py
                checker.build_description(prompt=prompt)
        except _RandomDrawn as error:
            raise UnsupportedInstruction(
                f"{instruction_id}: lm-eval would replace an argument with a random one "
                f"(given {kwargs}); give a valid value for each of "
                f"{checker.get_instruction_args_keys()}"
            ) from error
        except (TypeError, ValueError) as error:
            raise UnsupportedInstruction(f"{instruction_id}: {error}") from error
        finally:
            for module, real in zip(modules, saved, strict=True):
                module.random = real  # type: ignore[attr-defined]  # as above
    return checker.check_following


def _constant(verdict: bool) -> Check:
    """A check with the same verdict for every response."""
    return lambda response: verdict


def compile_constraint(
    instruction_id: str, kwargs: Mapping[str, Any] | None, prompt: str = ""
) -> Check:
    """One constraint as a check of a response; `UnsupportedInstruction` if it cannot be."""
    if instruction_id not in lm_eval_instructions():
        raise UnsupportedInstruction(f"no IFEval instruction {instruction_id!r}")
    if instruction_id in NEEDS_PUNKT and not punkt_installed():
        raise UnsupportedInstruction(
            f"{instruction_id} counts with nltk's punkt_tab data, which is not installed "
            "here; install it with `python -m nltk.downloader punkt_tab`"
        )
    given = clean_kwargs(kwargs)
    if instruction_id not in COUNTED:
        return lm_eval_check(instruction_id, given, prompt)
    count_key, relation_key = COUNTED[instruction_id]
    if count_key not in given or relation_key not in given:
        raise UnsupportedInstruction(f"{instruction_id} needs {count_key} and {relation_key}")
    checks: list[Check] = []
    for relation, target in bounds(given[relation_key], given[count_key]):
        if target <= 0:  # lm-eval would pick a random target; the answer needs no count
            checks.append(_constant(relation == "at least"))
            continue
        bound = {**given, count_key: target, relation_key: relation}
        checks.append(lm_eval_check(instruction_id, bound, prompt))
    return lambda response: all(check(response) for check in checks)


def compile_constraints(constraints: list[Constraint], prompt: str = "") -> list[Check]:
    return [compile_constraint(i, kwargs, prompt) for i, kwargs in constraints]


def strict(response: str, checks: list[Check]) -> list[bool]:
    """lm-eval's strict mode: each check on the response as written (empty follows nothing)."""
    return [bool(response.strip()) and bool(check(response)) for check in checks]


def loose_variants(response: str) -> list[str]:
    """lm-eval's loose reading: the first and/or last line dropped, '*' removed."""
    lines = response.split("\n")
    cuts = [
        response,
        "\n".join(lines[1:]).strip(),
        "\n".join(lines[:-1]).strip(),
        "\n".join(lines[1:-1]).strip(),
    ]
    return [cuts[0], cuts[0].replace("*", ""), *cuts[1:], *(c.replace("*", "") for c in cuts[1:])]


def loose(response: str, checks: list[Check]) -> list[bool]:
    """lm-eval's loose mode: a check holds if it holds on any loose variant."""
    variants = [v for v in loose_variants(response) if v.strip()]
    return [any(check(v) for v in variants) for check in checks]


def check(instruction_id: str, response: str, kwargs: Mapping[str, Any] | None = None) -> bool:
    """Does `response` (already stripped of reasoning) follow one instruction, strictly?"""
    return strict(response, [compile_constraint(instruction_id, kwargs)])[0]


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
    "validate_choice": ("detectable_format:constrained_response", {}),
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


def choice_options(options: Any) -> set[str]:
    """RLVR-IFeval writes validate_choice's options as one string or a list."""
    if isinstance(options, str):
        return set(re.findall(r"['\"]([^'\"]+)['\"]", options)) or {options}
    return {str(o) for o in options or ()}


def constraints_from_rlvr(ground_truth: str | Mapping[str, Any]) -> list[Constraint]:
    """An RLVR-IFeval `ground_truth` (JSON with `func_name` and arguments) as IFEval ids."""
    truth = json.loads(ground_truth) if isinstance(ground_truth, str) else dict(ground_truth)
    name = truth.get("func_name")
    if name not in _RLVR:
        raise UnsupportedInstruction(f"unknown RLVR-IFeval verifier {name!r}")
    if name == "validate_choice" and choice_options(truth.get("options")) - set(
        CONSTRAINED_OPTIONS
    ):
        raise UnsupportedInstruction(
            f"validate_choice with options {truth.get('options')!r}: IFEval's "
            f"constrained_response knows only {list(CONSTRAINED_OPTIONS)}"
        )
    instruction_id, fields = _RLVR[name]
    kwargs = {}
    for key, source in fields.items():
        value = source[0] if isinstance(source, tuple) else truth.get(source)
        if value is not None:
            kwargs[key] = value
    return [(instruction_id, kwargs)]
