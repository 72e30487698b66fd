"""Registered as "repetition_penalty": 0.0 for varied text, down to -1.0 for repetitive text.

Text too short to judge gets a small fixed penalty; a repeated sentence (of more than three
words) gets a heavy one at once. Otherwise four repetition rates (content words, 3-5
word phrases, stuttered words, repeated sentence openings) are weighted and summed, and
the part above `threshold` is scaled to a penalty of at least 0.1.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from typing import Any

from .registry import registry
from .reward_function import RewardFunction

logger = logging.getLogger(__name__)

DEFAULT_COMPONENT_WEIGHTS = {
    "word_repetition": 0.3,
    "phrase_repetition": 0.4,
    "consecutive_repetition": 0.6,
    "beginning_repetition": 0.5,
}
DEFAULT_STOPWORDS = frozenset(
    "this that with from what when where which who whom whose will shall should would "
    "could have has had been being than then there these those their".split()
)


def _repeats(counter: Counter, more_than: int = 1) -> int:
    """Occurrences beyond the first, over the items seen more than `more_than` times."""
    return sum(count - 1 for count in counter.values() if count > more_than)


@registry.register
class RepetitionPenaltyReward(RewardFunction):
    """A penalty in [-1, 0] per completion; 0.0 means no notable repetition."""

    def __init__(
        self,
        threshold: float = 0.05,
        min_words: int = 10,
        min_sentences: int = 2,
        short_text_penalty: float = -0.1,
        paragraph_repetition_base_penalty: float = -0.6,
        component_weights: dict[str, float] | None = None,
        stopwords: set[str] | None = None,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.threshold = threshold
        self.min_words = min_words
        self.min_sentences = min_sentences
        self.short_text_penalty = short_text_penalty
        self.paragraph_repetition_base_penalty = paragraph_repetition_base_penalty
        self.component_weights = {**DEFAULT_COMPONENT_WEIGHTS, **(component_weights or {})}
        self.stopwords = set(stopwords or DEFAULT_STOPWORDS)

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        """One penalty per completion (-0.2 if one cannot be analysed)."""
        rewards = []
        for completion in completions:
            try:
                rewards.append(self._penalty(self.get_content(completion)))
            except Exception:
                logger.exception("repetition analysis failed; penalising -0.2")
                rewards.append(-0.2)
        return rewards

    def _penalty(self, content: str) -> float:
        words = re.findall(r"\b\w+\b", content.lower())
        sentences = [s.strip() for s in re.split(r"[.!?]", content) if s.strip()]
        if len(words) < self.min_words or len(sentences) < self.min_sentences:
            return self.short_text_penalty
        repeated_sentences = sum(
            count - 1
            for sentence, count in Counter(sentences).items()
            if count > 1 and len(sentence.split()) > 3
        )
        if repeated_sentences > 0:
            share = min(1.0, repeated_sentences / len(sentences))
            return self.paragraph_repetition_base_penalty - share * 0.4
        score = self._repetition_score(words, sentences)
        if score <= self.threshold:
            return 0.0
        penalty = -min(1.0, (score - self.threshold) / (1 - self.threshold))
        return min(penalty, -0.1)

    def _repetition_score(self, words: list[str], sentences: list[str]) -> float:
        word_counts = Counter(w for w in words if len(w) > 3 and w not in self.stopwords)
        word_rate = _repeats(word_counts, more_than=2) / len(words)
        phrase_repeats = 0.0
        if len(words) >= 5:
            for n in range(3, 6):
                ngrams = Counter(" ".join(words[i : i + n]) for i in range(len(words) - n + 1))
                phrase_repeats += _repeats(ngrams) * (n / 3)
        phrase_rate = phrase_repeats / len(words)
        pairs = zip(words, words[1:], strict=False)
        stutters = sum(1 for prev, word in pairs if word == prev and len(word) > 2)
        stutter_rate = stutters / len(words)
        openings = Counter(" ".join(s.split()[:3]) for s in sentences if len(s.split()) >= 3)
        opening_rate = _repeats(openings) / len(sentences)
        weights = self.component_weights
        score = (
            word_rate * weights.get("word_repetition", 0.3)
            + phrase_rate * weights.get("phrase_repetition", 0.4)
            + stutter_rate * weights.get("consecutive_repetition", 0.6)
            + opening_rate * weights.get("beginning_repetition", 0.5)
        )
        logger.debug(
            "repetition rates: words %.3f phrases %.3f stutters %.3f openings %.3f -> %.3f",
            word_rate,
            phrase_rate,
            stutter_rate,
            opening_rate,
            score,
        )
        return score


def repetition_penalty_reward(
    completions: list[Any], threshold: float = 0.05, **kwargs: Any
) -> list[float]:
    """Function form of `RepetitionPenaltyReward(threshold=...).compute`."""
    return RepetitionPenaltyReward(threshold=threshold).compute(completions, **kwargs)
