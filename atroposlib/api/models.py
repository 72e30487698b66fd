"""The checks on a posted group that pydantic's field types cannot express.

The fields themselves are defined once in `atroposlib.protocol`. Cross-field rules
(shapes that must agree, finite scores, messages with role/content, the token
limit) live in `group_errors`, which returns errors in FastAPI's 422 format so
each one names the offending field. `messages: []` is the one length exception:
upstream's API and its SFT clients use it to mean "no conversation".

The same rules, as far as JSON Schema can state them, are what the OpenAPI
document publishes for the scored-data bodies (`group_schema`), beside the
documented error answers the routes share.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, Field

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


# ------------------------------------------------------- the OpenAPI description
# The scored-data routes read their raw body (gzip and pre-serialised JSON are
# handled before any model sees it), so FastAPI cannot derive their request schema;
# it is published from `ScoredData` here. The answers below are the ones the routes
# really give, so a client (or a fuzzer) can rely on the document.

CROSS_FIELD_RULES = (
    "Rules JSON Schema cannot state, answered with 422: `masks`, `scores` and every "
    "per-sequence field hold one entry per sequence of `tokens`; each mask and each "
    "per-token row (`advantages`, `inference_logprobs`, `ref_logprobs`) is as long as its "
    "token row; a group's env id names a registered environment; no sequence is over the "
    "registered `max_token_len`."
)


def group_schema() -> dict[str, Any]:
    """The JSON Schema of one posted group: `ScoredData`'s, plus the per-field rules."""
    schema = ScoredData.model_json_schema()
    properties = schema["properties"]
    properties["tokens"]["minItems"] = 1
    conversation = properties["messages"]["anyOf"][0]["items"]
    conversation["items"]["required"] = ["role", "content"]
    schema["description"] = f"One group: the rollouts of one prompt. {CROSS_FIELD_RULES}"
    return schema


def json_body(schema: dict[str, Any]) -> dict[str, Any]:
    """`openapi_extra` publishing a required JSON request body of `schema`."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


class ErrorDetail(BaseModel):
    """Why a request was refused."""

    detail: str = Field(description="What went wrong, and what to do about it.")


class ValidationIssue(BaseModel):
    loc: list[str | int] = Field(description="Where in the request: 'body' or 'query', then keys.")
    msg: str = Field(description="What is wrong there.")
    type: str = Field(description="The kind of error (pydantic's error type).")


class ValidationFailure(BaseModel):
    """A 422: every problem found in the request, each naming its field."""

    detail: list[ValidationIssue] = Field(description="One entry per problem.")


RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before retrying.",
        "required": True,
        "schema": {"type": "integer"},
    },
}


def refusal(description: str, **extra: Any) -> dict[str, Any]:
    """A documented `{"detail": "..."}` answer (JSON even on a plain-text route)."""
    content = {"application/json": {"schema": ErrorDetail.model_json_schema()}}
    return {"description": description, "content": content, **extra}


INVALID = {422: {"model": ValidationFailure, "description": "The request breaks a rule."}}
STORE_FAILED = {
    503: refusal("The durable store failed to read or write; retry later.", headers=RETRY_AFTER)
}
