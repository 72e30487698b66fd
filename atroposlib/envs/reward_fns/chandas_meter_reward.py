"""Registered as "chandas_meter" (and "chandasmeter"): how well a poem fits a Sanskrit meter.

The meter classifier comes from an optional package: upstream expects `chandas.Classifier`.
The `chandas` release on PyPI (0.0.10) has no such class, so in practice it is missing.
Creating the reward still works (the Sanskrit poetry environment builds it at start-up),
but `compute` then raises an ImportError naming the package; through `__call__` that
becomes a logged error and 0.0 scores, which is what upstream returns in that case.
"""

from __future__ import annotations

import logging
import re
from importlib import resources
from typing import Any

from .registry import registry
from .reward_function import RewardFunction

logger = logging.getLogger(__name__)

# IAST letters (and aspirate digraphs) that SLP1 writes differently; all else is unchanged.
_IAST_TO_SLP1 = {
    "kh": "K", "gh": "G", "ch": "C", "jh": "J", "ṭh": "W", "ḍh": "Q", "th": "T", "dh": "D",
    "ph": "P", "bh": "B", "ai": "E", "au": "O", "ā": "A", "ī": "I", "ū": "U", "ṛ": "f",
    "ṝ": "F", "ḷ": "x", "ḹ": "X", "ṅ": "N", "ñ": "Y", "ṭ": "w", "ḍ": "q", "ṇ": "R",
    "ś": "S", "ṣ": "z", "ṃ": "M", "ṁ": "M", "ḥ": "H",
}  # fmt: skip
# Two-character keys first, so "kh" wins over "k" and "ṭh" over "ṭ".
_IAST_PATTERN = re.compile("|".join(map(re.escape, sorted(_IAST_TO_SLP1, key=len, reverse=True))))

MISSING_PACKAGE_MESSAGE = (
    "the chandas_meter reward needs the 'chandas' package with a chandas.Classifier "
    "meter classifier; the 'chandas' release on PyPI does not provide one"
)


def iast_to_slp1(text: str) -> str:
    """Transliterate IAST text to SLP1 (the scheme the classifier reads)."""
    return _IAST_PATTERN.sub(lambda found: _IAST_TO_SLP1[found.group(0)], text)


def _packaged_data_file() -> str | None:
    """The meter data file shipped inside the chandas package, if it ships one."""
    try:
        data = resources.files("chandas") / "data" / "data.json"
        return str(data) if data.is_file() else None
    except Exception:
        return None


def _load_classifier() -> Any:
    try:
        from chandas import Classifier
    except ImportError as exc:
        logger.warning("%s (%s)", MISSING_PACKAGE_MESSAGE, exc)
        return None
    try:
        data = _packaged_data_file()
        if data is not None:
            return Classifier.from_json_file(data)
        return Classifier.from_default_location()
    except Exception:
        logger.exception("could not load the chandas meter classifier")
        return None


@registry.register
class ChandasMeterReward(RewardFunction):
    """1.0 for a confident match of `meter`, less for a weaker or a wrong one, within [0, 1]."""

    def __init__(self, meter: str = "tristubh", weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(weight=weight, **kwargs)
        self.meter = meter
        self.classifier = _load_classifier()

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        """Meter scores; raises ImportError when the classifier package is missing."""
        if self.classifier is None:
            raise ImportError(MISSING_PACKAGE_MESSAGE)
        return [self._score_text(self.get_content(c)) for c in completions]

    def _score_text(self, text: str) -> float:
        try:
            result = self.classifier.classify(iast_to_slp1(text))
            if not result:
                return 0.0
            predicted = str(getattr(result, "name", result)).lower()
            matches = predicted == self.meter.lower()
            score = float(getattr(result, "score", 1.0 if matches else 0.0))
            if not matches:
                score = 1.0 - score if score <= 1.0 else 0.0
            return max(0.0, min(1.0, score))
        except Exception:
            logger.exception("chandas could not score a poem; scoring 0.0")
            return 0.0
