"""A group from `/batch` as scored sequences, each split into its prompt and completion.

Design: the group's prompt is what its sequences share. In text mode upstream took the
longest common prefix of the decoded strings, which cuts into the completions when they
start alike ("42" and "45" share "4"). Here the split point is found on tokens: the
tokens every sequence shares, and no further than the prompt the masks mark (-100)
when they mark one; the text is then cut where that token prefix decodes. With
messages, the prompt is the leading messages every sequence shares, leaving each at
least one message of its own. A group whose lists disagree in length, whose scores are
not finite, or that lacks the messages asked for, raises `GroupProblem` (the caller
skips it and counts it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from atroposlib.protocol import ScoredData, group_problems

Messages = list[dict[str, Any]]


class Decoder(Protocol):
    def decode(self, token_ids: list[int]) -> str: ...


class GroupProblem(ValueError):
    """The group cannot be used; the message says why."""


@dataclass
class Scored:
    """One sequence of a group: its score, prompt and completion (text or messages)."""

    score: float
    prompt: str | Messages
    completion: str | Messages

    @property
    def whole(self) -> str | Messages:
        return self.prompt + self.completion  # type: ignore[operator]


def _field(group: Any, name: str) -> Any:
    if isinstance(group, Mapping):
        return group.get(name)
    return getattr(group, name, None)


def _shared_length(rows: Sequence[Sequence[Any]]) -> int:
    """How many leading items every row has in common."""
    shortest = min(len(row) for row in rows)
    for index in range(shortest):
        first = rows[0][index]
        if any(row[index] != first for row in rows[1:]):
            return index
    return shortest


def _leading_masked(mask: Sequence[int]) -> int:
    count = 0
    for value in mask:
        if value != -100:
            break
        count += 1
    return count


def check_group(group: Any, messages: bool) -> tuple[list[list[int]], list[float]]:
    """The group's tokens and scores, after the protocol's checks (`group_problems`):
    the same rules the API applies at intake and a trainer applies to a batch."""
    try:
        scored = group if isinstance(group, ScoredData) else ScoredData.model_validate(group)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise GroupProblem(f"the group does not parse: {where}: {first['msg']}") from exc
    problems = group_problems(scored)
    if problems:
        raise GroupProblem("; ".join(message for _, message in problems[:3]))
    if messages:
        chats = scored.messages
        if not chats:
            raise GroupProblem(
                "the group carries no messages (records of messages need an environment "
                "that sends them, e.g. --env.include_messages true; --save-messages false "
                "writes decoded text)"
            )
    return scored.tokens, [float(s) for s in scored.scores]


def text_sequences(group: Any, tokenizer: Decoder) -> list[Scored]:
    """The group's sequences as decoded text, split at the group's shared prompt."""
    tokens, scores = check_group(group, messages=False)
    cut = _shared_length(tokens)
    masks = _field(group, "masks")
    if masks:
        marked = min(_leading_masked(mask) for mask in masks)
        if marked:
            cut = min(cut, marked)
    prompt = tokenizer.decode(tokens[0][:cut])
    out = []
    for row, score in zip(tokens, scores, strict=True):
        text = tokenizer.decode(row)
        if text.startswith(prompt):
            completion = text[len(prompt) :]
        else:  # the prefix decodes differently alone: decode the rest alone too
            completion = tokenizer.decode(row[cut:])
        out.append(Scored(score, prompt, completion))
    return out


def message_sequences(group: Any) -> list[Scored]:
    """The group's sequences as chat messages, split after the messages they share."""
    _, scores = check_group(group, messages=True)
    chats: list[Messages] = [list(chat) for chat in _field(group, "messages")]
    cut = min(_shared_length(chats), min(len(chat) for chat in chats) - 1)
    cut = max(cut, 0)
    return [
        Scored(score, chat[:cut], chat[cut:]) for chat, score in zip(chats, scores, strict=True)
    ]


def carries_messages(group: Any) -> bool:
    """Whether the group holds chat messages: the records' form when --save-messages is unset."""
    return bool(_field(group, "messages"))


def sequences(group: Any, tokenizer: Decoder | None, messages: bool) -> list[Scored]:
    """The group's scored sequences, as messages or (with a tokenizer) as text."""
    if messages:
        return message_sequences(group)
    if tokenizer is None:
        raise ValueError("text mode needs a tokenizer")
    return text_sequences(group, tokenizer)
