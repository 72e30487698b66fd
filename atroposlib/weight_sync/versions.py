"""Which weights sampled a completion, read from the engine's answer.

vLLM (and atropos-inference-server) put `weight_versions`, a list of
`{"version", "start", "end"}` spans, on each choice. Token-level calls return
upstream's 4-tuple whose last member is the finish reasons; to carry the version
without changing that shape, each reason is a `FinishReason`: a `str` equal to
"stop" / "length" that also has a `weight_version` attribute. Code that treats it
as a string (all of upstream's) sees no difference.
"""

from __future__ import annotations

from typing import Any


class FinishReason(str):
    """A finish reason that remembers the oldest weight version of its tokens."""

    weight_version: str | None = None

    def __new__(cls, reason: str, weight_version: str | None = None) -> FinishReason:
        value = super().__new__(cls, reason)
        value.weight_version = weight_version
        return value


def choice_weight_version(choice: Any) -> str | None:
    """The oldest version in a choice's `weight_versions` (an SDK object or a dict)."""
    spans = choice.get("weight_versions") if isinstance(choice, dict) else None
    if spans is None and not isinstance(choice, dict):
        spans = getattr(choice, "weight_versions", None)
    if not spans:
        return None
    first = spans[0]
    version = first.get("version") if isinstance(first, dict) else getattr(first, "version", None)
    return str(version) if version is not None else None


def weight_version_of(finish: Any) -> str | None:
    """The version a finish reason carries (None for a plain string or a dict)."""
    return getattr(finish, "weight_version", None)


def version_number(label: object) -> int | None:
    """A version label as the trainer step it names, or None: only ASCII digits count,
    since `"²".isdigit()` is True and `int("²")` raises (VER-3 of the trainer review)."""
    if isinstance(label, str) and label.isascii() and label.isdigit():
        return int(label)
    return None


def oldest_version(first: str | None, then: str | None) -> str | None:
    """The label of a sequence whose earlier turns `first` and newest turn `then`
    sampled: the oldest weights, so that --max-staleness bounds every turn it trains
    (VER-2). Labels that are not numbers cannot be ordered: the earlier turn's wins."""
    if first is None or then is None:
        return first if then is None else then
    first_number, then_number = version_number(first), version_number(then)
    if first_number is not None and then_number is not None and then_number < first_number:
        return then
    return first
