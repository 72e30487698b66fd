"""The checks on a posted group that pydantic's field types cannot express.

The fields themselves, and the rules that make a group trainable (shapes that must
agree, finite scores and per-token values, token ids within the trainer's vocabulary,
messages with role/content, the token limit), are defined once in
`atroposlib.protocol`; `group_errors` returns them in FastAPI's 422 format, so each
one names the offending field.

The same rules, as far as JSON Schema can state them, are what the OpenAPI
document publishes for the scored-data bodies (`group_schema`), beside the
documented error answers the routes share.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from atroposlib.protocol import ScoredData, group_problems


def _error(loc: tuple, msg: str, kind: str = "value_error") -> dict[str, Any]:
    return {"type": kind, "loc": list(loc), "msg": msg}


def group_errors(
    group: ScoredData,
    loc: tuple = ("body",),
    max_token_len: int = -1,
    vocab_size: int | None = None,
) -> list[dict[str, Any]]:
    """`group_problems` (atroposlib.protocol) in FastAPI's 422 format; [] when acceptable."""
    return [
        _error((*loc, *where), message)
        for where, message in group_problems(group, max_token_len, vocab_size)
    ]


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
    "registered `max_token_len`; no token id is at or above the `vocab_size` the trainer "
    "registered; per-token values are finite wherever a token is trained (a position after "
    "the first whose mask is not -100), and a logprob (`inference_logprobs`, "
    "`ref_logprobs`) there is at most 0.001 (a probability is at most 1)."
)


def group_schema() -> dict[str, Any]:
    """The JSON Schema of one posted group: `ScoredData`'s, plus the per-field rules."""
    schema = ScoredData.model_json_schema()
    properties = schema["properties"]
    properties["tokens"]["minItems"] = 1
    sequence = properties["tokens"]["items"]
    sequence["minItems"] = 1  # an empty sequence cannot be trained on
    sequence["items"]["minimum"] = 0  # token ids index the embedding
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


Responses = dict[int | str, dict[str, Any]]
"""A route's `responses=` documentation, as FastAPI types it."""

INVALID: Responses = {
    422: {"model": ValidationFailure, "description": "The request breaks a rule."}
}
INVALID_ON_PLAIN_TEXT: Responses = {
    422: {
        "description": INVALID[422]["description"],
        "content": {"application/json": {"schema": ValidationFailure.model_json_schema()}},
    }
}
"""`INVALID` for a route whose own answer is plain text (FastAPI would document it so)."""
STORE_FAILED: Responses = {
    503: refusal("The durable store failed to read or write; retry later.", headers=RETRY_AFTER)
}
