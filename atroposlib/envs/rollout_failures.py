"""How a failed rollout is reported: a context refusal once per env, another error once
per place it was raised.

A model whose context cannot hold an env's requests (the tiny model's 512 tokens under
gsm8k's default `max_tokens` of 1024) fails every item the same way, and a traceback per
item buried the one fact that mattered. So the inference server's 400 for a request
longer than its context is recognised from its message (this project's server, vLLM,
SGLang, llama.cpp and OpenAI word it differently, so it is read loosely) and logged once,
as one line that names the env, the prompt's length, the context and what to change;
later refusals are only counted (`context_refusals`, also in `rollout_errors`).

Any other error is logged with its traceback the first time it is raised at a given
place (exception type and innermost frame), and only counted after that, with a DEBUG
line per item: the same bug on every item is one traceback, two bugs are two.
`process` and the `serve` runtime share this; each env process has one reporter, and
`serve` one more for its evaluations (`EvaluationFailures`: `eval_errors`,
`eval_context_refusals`). The `evaluate` command, which ends on its one evaluation's
error, ends on a context refusal with the same one line and no traceback
(`refused_plainly`).
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("atroposlib.envs")

# how servers say it: "maximum context length", "context size", "maximum model length"
CONTEXT_WORDS = re.compile(
    r"context[ _](?:length|size|window)|maximum model length|context_length_exceeded", re.I
)
TOO_LONG_WORDS = re.compile(r"exceed|longer than|too large|too long|reduce", re.I)
PROMPT_TOKENS = [
    r"prompt (?:has )?(\d+) tokens",  # this project's server
    r"\((\d+) in the messages",  # vLLM: "(1000 in the messages, 4000 in the completion)"
    r"request has (\d+) input tokens",  # vLLM
    r"prompt \(length (\d+)\)",  # vLLM's "decoder prompt (length 600)"
    r"input \((\d+) tokens\)",  # SGLang
    r"(\d+) tokens from the input",  # SGLang
    r"messages resulted in (\d+) tokens",  # OpenAI
    r"request \((\d+) tokens\)",  # llama.cpp
]
CONTEXT_TOKENS = [
    r"maximum context length (?:is |of )?(\d+)",
    r"maximum model length (?:is |of )?(\d+)",
    r"context length \((\d+)",
    r"context size \((\d+)",
]
MAX_TOKENS = [
    r"max_tokens (\d+)",  # this project's server
    r"is too large: (\d+)",  # vLLM
    r"(\d+) in the completion",  # vLLM
    r"(\d+) tokens for the completion",  # SGLang
]


def _first_number(patterns: list[str], text: str) -> int | None:
    for pattern in patterns:
        found = re.search(pattern, text, re.I)
        if found:
            return int(found.group(1))
    return None


@dataclass(frozen=True)
class ContextRefusal:
    """A request the inference server refused for being longer than its context."""

    message: str  # the server's words
    prompt_tokens: int | None = None
    max_tokens: int | None = None
    context: int | None = None

    def line(self, env_name: str, config: Any = None) -> str:
        """One line for people: the env, the lengths, and what to change."""
        prompt, asked, context = self.prompt_tokens, self.max_tokens, self.context
        if prompt is None or context is None:
            return (
                f"{env_name}: the inference server refused a request for its context length "
                f"({self.message}); ask for fewer completion tokens (--env.max_tokens) or use "
                "a model with a longer context"
            )
        if prompt >= context:
            return (
                f"{env_name}: a prompt of {prompt} tokens does not fit the model's context of "
                f"{context} tokens; this env needs a model with a longer context"
            )
        env_max_tokens = getattr(config, "max_tokens", None)
        change = ""
        if asked is not None and asked == env_max_tokens:
            change = f"lower --env.max_tokens to {context - prompt} or less, or "
        elif (
            asked is not None
            and isinstance(env_max_tokens, int)
            and asked < env_max_tokens
            and getattr(config, "max_token_length", 0) > context
        ):  # the env cut its completion to its own token budget: a multi-turn episode
            change = f"lower --env.max_token_length to {context} or less, or "
        plus = f" plus max_tokens {asked}" if asked is not None else " and its completion"
        return (
            f"{env_name}: a prompt of {prompt} tokens{plus} does not fit the model's context "
            f"of {context} tokens; {change}use a model with a longer context"
        )


def context_refusal(error: BaseException) -> ContextRefusal | None:
    """The context refusal `error` is, or was raised from; None for any other error."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        if CONTEXT_WORDS.search(text):
            context = _first_number(CONTEXT_TOKENS, text)
            if context is not None or TOO_LONG_WORDS.search(text):
                return ContextRefusal(
                    message=re.sub(r"^Error code: \d+ - ", "", text).strip(),
                    prompt_tokens=_first_number(PROMPT_TOKENS, text),
                    max_tokens=_first_number(MAX_TOKENS, text),
                    context=context,
                )
        current = current.__cause__ or current.__context__
    return None


def _raised_at(error: BaseException) -> tuple[str, str, int]:
    """The exception's type and the innermost frame it came from: "the same error"."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return type(error).__qualname__, str(error), 0
    return type(error).__qualname__, tb.tb_frame.f_code.co_filename, tb.tb_lineno


STUCK_REFUSALS = 16
"""A served env stops (`NoRolloutFits`) when at least this many rollouts, over at least
its `stop_when_refused_s`, were all refused for the context and none was kept: whatever
it samples is refused, and waiting would keep the run at step 0 for ever."""


class RolloutFailures:
    """Counts an env's failed rollouts in `env.stats` and logs what a person must see."""

    errors_stat = "rollout_errors"
    refusals_stat = "context_refusals"

    def __init__(self, env: Any) -> None:
        self.env = env
        self.refusals = 0
        self.errors: Counter[tuple[str, str, int]] = Counter()
        self.first_refusal: tuple[float, str] | None = None
        """When the first refusal came, and its line."""

    def every_rollout_refused(self, kept: int, now: float) -> str | None:
        """The reason to stop when every rollout so far was refused for the context
        (`STUCK_REFUSALS` of them over `stop_when_refused_s`, none kept, no other failure)."""
        stop_s = getattr(self.env.config, "stop_when_refused_s", 0)
        if kept or not stop_s or sum(self.errors.values()) or self.first_refusal is None:
            return None
        since, line = self.first_refusal
        if self.refusals < STUCK_REFUSALS or now - since < stop_s:
            return None
        return (
            f"{line}; all {self.refusals} rollouts in {now - since:.0f}s were refused and "
            "none was kept, so this env stops"
        )

    @property
    def env_name(self) -> str:
        return self.env.name or type(self.env).__name__

    def label(self) -> str:
        """Who the refusal line names."""
        return self.env_name

    def what(self, item: Any) -> str:
        """The failed work, for its log lines."""
        return f"rollout of item {item!r}"

    def record(self, item: Any, error: BaseException) -> None:
        """One failed rollout of `item`."""
        self.env.stats[self.errors_stat] += 1
        refusal = context_refusal(error)
        if refusal is not None:
            self.env.stats[self.refusals_stat] += 1
            self.refusals += 1
            if self.refusals == 1:
                line = refusal.line(self.label(), self.env.config)
                self.first_refusal = (time.monotonic(), line)
                logger.error(
                    "%s; later refusals are counted (%s), not logged", line, self.refusals_stat
                )
            else:
                logger.debug("%s refused: %s", self.what(item), refusal.message)
            return
        place = _raised_at(error)
        self.errors[place] += 1
        if self.errors[place] == 1:
            logger.error("%s failed", self.what(item), exc_info=error)
        else:
            logger.debug(
                "%s failed again: %s: %s (%d times; traceback logged the first)",
                self.what(item),
                type(error).__name__,
                error,
                self.errors[place],
            )

    def summary(self) -> str:
        """The failures so far, for a closing line: "40 failed (40 refused ...)"."""
        failed = sum(self.errors.values()) + self.refusals
        if not self.refusals:
            return f"{failed} failed"
        return f"{failed} failed, {self.refusals} of them refused for the model's context length"


class EvaluationFailures(RolloutFailures):
    """A served env's failed evaluations (`record(step, error)`), reported as rollouts
    are: an evaluation fails every `steps_per_eval` steps the same way a rollout does."""

    errors_stat = "eval_errors"
    refusals_stat = "eval_context_refusals"

    def label(self) -> str:
        return f"{self.env_name} evaluation"

    def what(self, item: Any) -> str:
        return f"evaluate() at step {item}"


class ContextRefused(RuntimeError):
    """A command ended by a context refusal; its message is the refusal's one line."""


class NoRolloutFits(ContextRefused):
    """`serve` ended because every rollout was refused for the context: a setting to
    change, not a crash to retry (the env exits 2, which the launcher does not restart)."""


def refused_plainly(error: BaseException, env: Any) -> ContextRefused | None:
    """`error` as the one line `ContextRefused` where it is a context refusal (the
    `evaluate` command's end), else None: another error keeps its traceback."""
    refusal = context_refusal(error)
    if refusal is None:
        return None
    return ContextRefused(refusal.line(env.name or type(env).__name__, env.config))
