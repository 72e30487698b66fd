"""Does a response's final answer equal a gold answer? Shared by two math rewards.

math-verify does the real work (LaTeX parsing, symbolic equality); a numeric fallback
covers responses it cannot parse, such as GSM8K's "#### 42" with no LaTeX at all. The
steps and their order follow upstream, so scores match it.
"""

from __future__ import annotations

import logging
import re

from latex2sympy2_extended import NormalizationConfig
from math_verify import LatexExtractionConfig, parse, verify

logger = logging.getLogger(__name__)

_BOXED = re.compile(r"\\boxed\{([^}]+)\}")
_GSM8K_TEXT = re.compile(r"####\s*(.*?)(?:\s*$|\n)")
_GSM8K_NUMBER = re.compile(r"####\s*([\d\.]+)")


def normalize_number(text: str) -> float:
    """`float` of a number written with thousands separators ("1,234" -> 1234.0)."""
    return float(text.replace(",", "").strip())


def extract_final_answer(text: str) -> str:
    """The answer after "####", else the first `\\boxed{...}`, else `text` unchanged."""
    if "####" in text:
        found = _GSM8K_TEXT.search(text)
        if found:
            return found.group(1).strip()
    if "\\boxed{" in text:
        found = _BOXED.search(text)
        if found:
            return found.group(1).strip()
    return text


def _gold_number(gold: object) -> float | int | None:
    if isinstance(gold, (int, float)):
        return gold
    if not isinstance(gold, str):
        return None
    text = gold.replace("\\boxed{", "").replace("}", "") if "\\boxed{" in gold else gold
    try:
        return normalize_number(text)
    except ValueError:
        return None


def _response_config() -> list[LatexExtractionConfig]:
    normalization = NormalizationConfig(
        nits=False,
        malformed_operators=False,
        basic_latex=True,
        equations=True,
        boxed="all",
        units=True,
    )
    return [
        LatexExtractionConfig(
            normalization_config=normalization,
            boxed_match_priority=0,
            try_extract_without_anchor=False,
        )
    ]


def _math_verify(content: str, gold: float | int | str) -> bool | None:
    """math-verify's verdict, or None when the response (or gold) does not parse."""
    answer = parse(content, extraction_config=_response_config(), extraction_mode="first_match")
    if not answer:
        return None
    gold_text = gold if isinstance(gold, str) and "\\boxed" in gold else f"\\boxed{{{gold}}}"
    gold_parsed = parse(
        gold_text, extraction_mode="first_match", extraction_config=[LatexExtractionConfig()]
    )
    if not gold_parsed:
        return None
    return bool(verify(answer, gold_parsed))


def _numeric_match(content: str, gold_value: float, tolerance: float) -> bool | None:
    boxed = _BOXED.findall(content)
    if boxed:
        try:
            return abs(normalize_number(boxed[0]) - gold_value) < tolerance
        except ValueError:
            logger.debug("boxed answer %r is not a number", boxed[0])
    if "####" in content:
        found = _GSM8K_NUMBER.search(content)
        if found:
            return abs(normalize_number(found.group(1)) - gold_value) < tolerance
    return None


def verify_answer(content: str, gold_answer: float | int | str, tolerance: float = 1e-6) -> bool:
    """True when `content`'s answer equals `gold_answer` (GSM8K "####" golds accepted)."""
    if isinstance(gold_answer, str) and "####" in gold_answer:
        gold_answer = extract_final_answer(gold_answer)
    gold_value = _gold_number(gold_answer)
    try:
        verdict = _math_verify(content, gold_answer)
        if verdict is not None:
            return verdict
    except Exception as exc:
        logger.debug("math-verify could not check %r: %s", content[:80], exc)
    if gold_value is not None:
        try:
            return bool(_numeric_match(content, gold_value, tolerance))
        except Exception as exc:
            logger.debug("numeric check failed for %r: %s", content[:80], exc)
    return False
