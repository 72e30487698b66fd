"""The base class every reward function derives from.

A reward function scores a batch of completions; `compute` returns raw scores and
`__call__` multiplies them by the instance's weight. A reward never raises on any
input: `score_each` grades completions one by one, so an exception in one completion's
grading scores that completion 0.0 (logged) and leaves the rest of the batch alone; and
`__call__` scores the whole batch 0.0 (logged) if `compute` itself fails, so one broken
reward cannot stop a rollout. Call `compute` directly to see a batch-level error.

Defaults for `weight`, the instance name and the wandb logger also live on the class, so
subclasses that skip `super().__init__` (upstream's poker environment does) still work.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)
_LOGGED: set[str] = set()
_LOGGED_MAX = 1000


def log_once(log: logging.Logger, message: str) -> None:
    """Warn with `message` the first time it occurs: a bad item in a loop logs one line."""
    if message in _LOGGED:
        return
    if len(_LOGGED) < _LOGGED_MAX:
        _LOGGED.add(message)
    log.warning(message)


class RewardFunction(ABC):
    """Scores completions; `weight` scales what `__call__` returns."""

    weight: float = 1.0
    _name: str | None = None
    wandb_logger: Any = None

    def __init__(self, weight: float = 1.0, name: str | None = None, **kwargs: Any) -> None:
        """Store the weight, an optional instance name and any extra settings in `config`."""
        self.weight = weight
        self._name = name
        self.config: dict[str, Any] = kwargs
        self.wandb_logger = None

    @property
    def name(self) -> str:
        """The instance name if one was given, else the lower-cased class name."""
        return self._name or type(self).__name__.lower()

    @abstractmethod
    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        """Raw (unweighted) scores, one per completion."""

    def __call__(self, completions: list[Any], **kwargs: Any) -> list[float]:
        """Weighted scores; 0.0 for every completion if `compute` fails."""
        try:
            raw = self.compute(completions, **kwargs)
            weighted = [score * self.weight for score in raw]
            if self.wandb_logger:
                self.log_metrics(raw, weighted)
            return weighted
        except Exception:
            logger.exception("reward function %s failed; scoring the batch 0.0", self.name)
            return [0.0] * len(completions)

    def score_each(
        self,
        completions: list[Any],
        grade: Callable[[Any], float],
        read: Callable[[Any], Any] | None = None,
    ) -> list[float]:
        """`grade` of what `read` takes from each completion (its text by default); 0.0,
        logged once, where reading or grading raises."""
        read = read or self.get_content
        scores = []
        for completion in completions:
            try:
                scores.append(float(grade(read(completion))))
            except Exception as error:
                log_once(
                    logger,
                    f"reward {self.name}: grading a completion raised "
                    f"{type(error).__name__}: {error}; it scores 0.0",
                )
                scores.append(0.0)
        return scores

    def set_wandb_logger(self, logger: Any) -> None:
        """Log each batch's statistics to this object's `log(dict)` from now on."""
        self.wandb_logger = logger

    def log_metrics(self, raw_rewards: list[float], weighted_rewards: list[float]) -> None:
        """Send mean raw, mean weighted, min and max of one batch to the wandb logger."""
        if not self.wandb_logger or not raw_rewards:
            return
        prefix = f"reward/{self.name}"
        self.wandb_logger.log(
            {
                f"{prefix}/mean_raw": sum(raw_rewards) / len(raw_rewards),
                f"{prefix}/mean_weighted": sum(weighted_rewards) / len(weighted_rewards),
                f"{prefix}/min": min(raw_rewards),
                f"{prefix}/max": max(raw_rewards),
            }
        )

    @staticmethod
    def get_content(completion: Any) -> str:
        """The assistant text of a completion, or "" when there is none.

        Accepts a plain string, an assistant message dict, a dict whose "message" is an
        assistant message, or a list of messages (the first assistant message wins). A
        message's content may be text or OpenAI's list of parts (the text parts join).
        Deliberate difference from upstream: a null content (a tool-call turn) reads as
        "". Upstream hands the None on, and the reward then raises or scores it through
        its error path (repetition_penalty: -0.2; formatreasoning: the text "None").
        """
        if isinstance(completion, str):
            return completion
        if isinstance(completion, dict):
            if _is_assistant_message(completion):
                return _text_of(completion["content"])
            inner = completion.get("message")
            if isinstance(inner, dict) and _is_assistant_message(inner):
                return _text_of(inner["content"])
        elif isinstance(completion, list):
            for message in completion:
                if isinstance(message, dict) and _is_assistant_message(message):
                    return _text_of(message["content"])
        return ""


def _is_assistant_message(message: dict) -> bool:
    return message.get("role") == "assistant" and "content" in message


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        return "".join(p for p in parts if isinstance(p, str))
    return ""
