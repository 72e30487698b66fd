"""The checks on a posted group that pydantic's field types cannot express.

The fields themselves are defined once in `atroposlib.protocol`. Cross-field rules
(shapes that must agree, finite scores, messages with role/content, the token
limit) live in `group_errors`, which returns errors in FastAPI's 422 format so
each one names the offending field. `messages: []` is the one length exception:
upstream's API and its SFT clients use it to mean "no conversation".
"""

from __future__ import annotations

import math
from typing import Any

from atroposlib.protocol import PER_SEQUENCE_FIELDS, ScoredData
from atroposlib.token_limit import exceeds_token_limit

PER_TOKEN_FIELDS = ("advantages", "inference_logprobs", "ref_logprobs")
"""Per-sequence fields with one value per token, aligned with `tokens`."""


def _error(loc: tuple, msg: str, kind: str = "value_error") -> dict[str, Any]:
    return {"type": kind, "loc": list(loc), "msg": msg}


def group_errors(
    group: ScoredData, loc: tuple = ("body",), max_token_len: int = -1
) -> list[dict[str, Any]]:
    """Rules that span fields; [] when the group is acceptable."""
    errors: list[dict[str, Any]] = []
    n = len(group.tokens)
    if n == 0:
        errors.append(_error((*loc, "tokens"), "a group needs at least one sequence"))
    if len(group.masks) != n:
        errors.append(
            _error((*loc, "masks"), f"masks has {len(group.masks)} sequences, tokens has {n}")
        )
    else:
        for i, (toks, mask) in enumerate(zip(group.tokens, group.masks, strict=True)):
            if len(toks) != len(mask):
                errors.append(
                    _error(
                        (*loc, "masks", i),
                        f"mask length {len(mask)} differs from token length {len(toks)}",
                    )
                )
    if len(group.scores) != n:
        errors.append(
            _error((*loc, "scores"), f"scores has {len(group.scores)} entries for {n} sequences")
        )
    for i, score in enumerate(group.scores):
        if not math.isfinite(score):
            errors.append(_error((*loc, "scores", i), f"score must be finite, got {score}"))
    for field in PER_SEQUENCE_FIELDS:
        value = getattr(group, field)
        if field == "messages" and value == []:
            continue  # upstream's "no conversation": accepted and passed on as []
        if value is not None and len(value) != n:
            errors.append(
                _error((*loc, field), f"{field} has {len(value)} entries for {n} sequences")
            )
        elif value is not None and field in PER_TOKEN_FIELDS:
            # the trainer reads these position by position beside the tokens: another
            # length would be broadcast or fail deep inside its loss
            for i, (toks, row) in enumerate(zip(group.tokens, value, strict=True)):
                if len(row) != len(toks):
                    errors.append(
                        _error(
                            (*loc, field, i),
                            f"{field}[{i}] has {len(row)} values for {len(toks)} tokens",
                        )
                    )
    if group.messages is not None:
        for i, conversation in enumerate(group.messages):
            for j, message in enumerate(conversation):
                if "role" not in message or "content" not in message:
                    errors.append(
                        _error(
                            (*loc, "messages", i, j),
                            "every message needs 'role' and 'content'",
                        )
                    )
    if max_token_len > 0:
        for i, toks in enumerate(group.tokens):
            if exceeds_token_limit(len(toks), max_token_len):
                errors.append(
                    _error(
                        (*loc, "tokens", i),
                        f"sequence has {len(toks)} tokens, over the registered "
                        f"max_token_len {max_token_len}",
                    )
                )
    return errors
