"""Registered as "format": does a completion contain `<tag>...</tag>` blocks?

Tags are matched literally (escaped), across lines, case-insensitively by default.
Deliberate difference from upstream, which puts tag names into its regex unescaped: a
tag "a.b" does not match `<axb>...</axb>` here, and a tag "x(" is a tag, not an error.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from .registry import registry
from .reward_function import RewardFunction

logger = logging.getLogger(__name__)


@registry.register
class FormatReward(RewardFunction):
    """1.0 when any preferred tag (or, with `require_all_tags`, every one) is present."""

    def __init__(
        self,
        preferred_tags: list[str] | None = None,
        require_all_tags: bool = False,
        case_sensitive: bool = False,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.preferred_tags = preferred_tags or ["think", "answer"]
        self.require_all_tags = require_all_tags
        self.case_sensitive = case_sensitive

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        """1.0 or 0.0 per completion."""
        flags = re.DOTALL | (0 if self.case_sensitive else re.IGNORECASE)
        patterns = [
            re.compile(f"<{re.escape(tag)}>.*?</{re.escape(tag)}>", flags)
            for tag in self.preferred_tags
        ]
        check = all if self.require_all_tags else any
        rewards = [
            1.0 if check(p.search(self.get_content(c)) for p in patterns) else 0.0
            for c in completions
        ]
        logger.info("format reward: %s/%s completions match", sum(rewards), len(rewards))
        return rewards


def format_reward(
    completions: list[Any], preferred_tags: list[str] | None = None, **kwargs: Any
) -> list[float]:
    """Function form of `FormatReward(preferred_tags=...).compute`."""
    return FormatReward(preferred_tags=preferred_tags).compute(completions, **kwargs)
