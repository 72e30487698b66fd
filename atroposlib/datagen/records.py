"""Groups to lines, the part both ways of reading groups share (a live API's batches and
a finished run's files).

Design: a tool's `Rules` turn one group into records (sft: the best sequences; dpo:
pairs). The `Recorder` applies them group by group with one form of record for the
whole file (TRL cannot load a file that mixes chat messages and strings): messages or
decoded text as --save-messages says, or, unset, as the first group says (messages when
it carries them). It skips and counts a group that cannot be used, lets the writer drop
identical records, and stops at exactly the goal.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Any

from atroposlib.datagen.dpo import dpo_record, pair_up
from atroposlib.datagen.groups import Decoder, GroupProblem, carries_messages, sequences
from atroposlib.datagen.settings import DpoGenSettings, SftGenSettings
from atroposlib.datagen.sft import keep_best, sft_record
from atroposlib.datagen.writer import JsonlWriter
from atroposlib.utils.tokenizers import TokenizerLoadError
from atroposlib.utils.tokenizers import load_tokenizer as load_named_tokenizer


class TokenizerError(ValueError):
    """The tokenizer that decodes the tokens cannot be loaded."""


Rules = Callable[[Any, Decoder | None, bool], list[dict[str, Any]]]
"""Turns one group into records: (group, tokenizer (None for messages), messages?)."""


def sft_rules(settings: SftGenSettings) -> Rules:
    def records(group: Any, tokenizer: Decoder | None, messages: bool) -> list[dict[str, Any]]:
        kept = keep_best(
            sequences(group, tokenizer, messages),
            settings.save_top_n_per_group,
            settings.allow_negative_scores,
            settings.minimum_score_diff_max_min,
        )
        return [sft_record(seq, messages, settings.format) for seq in kept]

    return records


def dpo_rules(settings: DpoGenSettings) -> Rules:
    rng = random.Random(settings.seed)

    def records(group: Any, tokenizer: Decoder | None, messages: bool) -> list[dict[str, Any]]:
        pairs = pair_up(
            sequences(group, tokenizer, messages),
            settings.save_n_pairs_per_group,
            settings.allow_negative_scores,
            settings.minimum_score_diff_max_min,
            rng,
        )
        return [dpo_record(c, r, messages, settings.format) for c, r in pairs]

    return records


def load_tokenizer(name: str, given_by: str = "--tokenizer") -> Decoder:
    """A Hugging Face tokenizer, or TokenizerError naming where the name came from."""
    try:
        return load_named_tokenizer(name, given_by)
    except TokenizerLoadError as error:
        raise TokenizerError(f"{error}, or use --save-messages") from None


def form_line(tool: str, messages: bool) -> str:
    """What the records hold when --save-messages was left unset, and how to change it."""
    if messages:
        return (
            f"{tool}: the groups carry chat messages, so the records are messages "
            "(--save-messages false writes decoded text instead)"
        )
    return f"{tool}: the groups carry no messages, so the records are decoded text"


class Recorder:
    """Writes each group's records into one file: one form of record, at most `goal` lines."""

    def __init__(
        self,
        tool: str,
        rules: Rules,
        writer: JsonlWriter,
        messages: bool | None,
        tokenizer: Decoder | None,
        goal: int | None,
        say: Callable[[str], None],
    ) -> None:
        self.tool = tool
        self.rules = rules
        self.writer = writer
        self.messages = messages
        """None until the first group decides (--save-messages unset)."""
        self.tokenizer = tokenizer
        self.goal = goal
        self.say = say
        self.groups = 0
        self.skipped: Counter[str] = Counter()

    @property
    def done(self) -> bool:
        return self.goal is not None and self.writer.count >= self.goal

    def add(self, group: Any) -> int:
        """Write the group's records (none past the goal); how many lines were written."""
        self.groups += 1
        if self.messages is None:
            self.messages = carries_messages(group)
            self.say(form_line(self.tool, self.messages))
        try:
            records = self.rules(group, None if self.messages else self.tokenizer, self.messages)
        except GroupProblem as problem:
            self.skipped[str(problem)] += 1
            self.say(f"{self.tool}: skipped a group: {problem}")
            return 0
        written = 0
        for record in records:
            if self.done:
                break
            written += self.writer.write(record)
        return written

    def counts(self, unit: str) -> str:
        """The summary's tail: groups skipped, duplicates dropped."""
        skipped = sum(self.skipped.values())
        return (
            f"{skipped} groups skipped as unusable; "
            f"{self.writer.duplicates} identical duplicate {unit}s dropped"
        )
