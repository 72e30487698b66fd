r"""Registered as "math_verify": 1.0 when every final `\boxed{}` answer equals the gold answer.

Design decisions (why, not how):

- Only the *final answer region* is graded: the text after the last `</think>`, cut at any
  `<think>` reopened after it. A `\boxed{2}` written while reasoning is a draft, not an
  answer, and a `<think>` that is never closed means the model never answered at all.
  (Upstream Atropos grades everything after the last `</think>`, the whole reply if none.)
- The answer must be boxed. Without a `\boxed{}` there is nothing to grade (score 0), so
  "the last number in the text" heuristics cannot be gamed by ending on the right number.
  (Upstream's config also reads an anchored "the answer is $16$".)
- Several boxed answers are allowed only when each one equals the gold (a restated answer
  is fine, hedging `\boxed{16} or \boxed{17}` is wrong), so each box must hold the whole
  answer: `\boxed{-1} and \boxed{4}` for the gold `\{-1, 4\}` is wrong. Upstream's
  math-verify config joins every boxed answer into one set instead; that rejects hedging
  too, but also a restatement spelled differently (`\boxed{1,234} = \boxed{1234.0}` is two
  elements) while it takes a set answered one element to a box. One rule for every gold
  (a box is one answer) is simpler to state and harder to game than set-joining.
- math-verify decides equality (LaTeX parsing plus symbolic comparison), with
  `malformed_operators` normalisation on (upstream: off), so common shorthand such as
  `\frac12` or `\sqrt3` equals `0.5` and `\sqrt{3}`; intervals, sets, equations (`x=5` vs
  `5`), thousands separators (`1,234`) and units (`18 \text{ dollars}`) are its rules. It
  is called as documented, `verify(gold, answer)`: the comparison is not symmetric, and a
  relation matches a set only when the *answer* is the set, so `[0, \infty)` is right for
  the gold `x \geq 0` and `x \geq 0` is wrong for the gold `[0, \infty)`. (Upstream passes
  the answer first, which reverses both.)
- Boxed contents are brace-matched as LaTeX groups them (so `\boxed{\frac{1}{2}}` is one
  answer, not `\frac{1`, and an escaped `\{` or `\}` neither opens nor closes a group, so
  it cannot hide a box from grading), `\boxed {16}` with a space (which LaTeX ignores) is
  a box too (upstream's math-verify does not read it), and they are capped in count
  (`MAX_BOXED`) and length (`MAX_ANSWER_CHARS`, padding included) so a spammed or enormous
  answer is rejected before sympy sees it; upstream has no caps. math-verify's own
  timeouts use SIGALRM, which only works on the main thread; off it they are switched off
  rather than crashing the grader.
"""

from __future__ import annotations

import logging
import re
import threading
from functools import lru_cache
from typing import Any

from latex2sympy2_extended import NormalizationConfig
from math_verify import LatexExtractionConfig, parse, verify

from .registry import registry
from .reward_function import RewardFunction, log_once

logger = logging.getLogger(__name__)

_BOXED_OPEN = re.compile(r"\\boxed\s*\{")
MAX_BOXED = 5
MAX_ANSWER_CHARS = 1000


def final_answer_region(text: str) -> str | None:
    """The text after the last `</think>` (up to any reopened `<think>`); None if unclosed."""
    if "</think>" in text:
        region = text.rsplit("</think>", 1)[1]
    elif "<think>" in text:
        return None
    else:
        region = text
    return region.split("<think>", 1)[0]


def boxed_contents(text: str) -> list[str]:
    r"""The brace-matched contents of every `\boxed{...}` in `text` (unclosed ones skipped)."""
    found = []
    for match in _BOXED_OPEN.finditer(text):
        depth, index = 1, match.end()
        while index < len(text) and depth:
            if text[index] == "\\":  # `\{`, `\}`, `\\` are characters, not delimiters
                index += 2
                continue
            if text[index] == "{":
                depth += 1
            elif text[index] == "}":
                depth -= 1
            index += 1
        if depth == 0:
            found.append(text[match.end() : index - 1])
    return found


def _extraction() -> list[LatexExtractionConfig]:
    normalization = NormalizationConfig(
        nits=False, malformed_operators=True, basic_latex=True, boxed="all", units=True
    )
    return [
        LatexExtractionConfig(
            normalization_config=normalization,
            boxed_match_priority=0,
            try_extract_without_anchor=False,
        )
    ]


def _timeout() -> int | None:
    return 5 if threading.current_thread() is threading.main_thread() else None


def _parse_boxed(content: str) -> list[Any]:
    return parse(
        f"\\boxed{{{content}}}",
        extraction_config=_extraction(),
        extraction_mode="first_match",
        parsing_timeout=_timeout(),
    )


@lru_cache(maxsize=4096)
def _parsed_gold(gold: str) -> tuple[Any, ...]:
    boxed = boxed_contents(gold)
    return tuple(_parse_boxed(boxed[-1] if boxed else gold.strip()))


def gold_from_solution(solution: str) -> str | None:
    r"""The last `\boxed{}` of a worked solution (MATH's `solution` column), or None."""
    boxed = boxed_contents(solution)
    return boxed[-1].strip() if boxed else None


def grade_answer(
    completion: str,
    gold: str | float | int,
    *,
    max_boxed: int = MAX_BOXED,
    max_answer_chars: int = MAX_ANSWER_CHARS,
) -> bool:
    """True when the final answer region's boxed answers (at least one) all equal `gold`."""
    region = final_answer_region(completion or "")
    if not region:
        return False
    answers = boxed_contents(region)
    if not answers or len(answers) > max_boxed:
        return False
    if any(not a.strip() or len(a) > max_answer_chars for a in answers):
        return False
    try:
        gold_parsed = list(_parsed_gold(str(gold)))
        if not gold_parsed:
            logger.warning("gold answer %r does not parse; scoring 0", gold)
            return False
        for answer in answers:
            parsed = _parse_boxed(answer)
            if not parsed or not verify(gold_parsed, parsed, timeout_seconds=_timeout()):
                return False
    except Exception as error:  # math-verify/sympy failures and timeouts: not a right answer
        logger.debug("math-verify failed on %r: %r", answers, error)
        return False
    return True


def gold_list(count: int, gold: Any, what: str = "gold answer") -> list[Any] | None:
    """One gold per completion: a list of `count` as given, a single value repeated.

    None (logged) when there is none, or a list of another length: zipping it with the
    completions would silently drop some of them.
    """
    if gold is None:
        log_once(logger, f"{what} missing; scoring 0.0")
        return None
    if not isinstance(gold, list):
        return [gold] * count
    if len(gold) != count:
        log_once(logger, f"{len(gold)} {what}s for {count} completions; scoring 0.0")
        return None
    return list(gold)


@registry.register(name="math_verify")
class MathVerifyReward(RewardFunction):
    r"""1.0 when the final `\boxed{}` answer(s) equal the gold answer (math-verify), else 0.0."""

    def __init__(
        self,
        max_boxed: int = MAX_BOXED,
        max_answer_chars: int = MAX_ANSWER_CHARS,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.max_boxed = max_boxed
        self.max_answer_chars = max_answer_chars

    def compute(
        self,
        completions: list[Any],
        answer: Any = None,
        ground_truth: Any = None,
        solution: Any = None,
        **kwargs: Any,
    ) -> list[float]:
        """Score against `answer`/`ground_truth`, else the last boxed answer of `solution`."""
        gold = answer if answer is not None else ground_truth
        if gold is None and solution is not None:
            solutions = solution if isinstance(solution, list) else [solution]
            gold = [gold_from_solution(s) or "" for s in solutions]
            gold = gold if isinstance(solution, list) else gold[0]
        golds = gold_list(len(completions), gold)
        if golds is None:
            return [0.0] * len(completions)
        return [
            float(
                grade_answer(
                    self.get_content(c),
                    g,
                    max_boxed=self.max_boxed,
                    max_answer_chars=self.max_answer_chars,
                )
            )
            for c, g in zip(completions, golds, strict=False)
        ]
