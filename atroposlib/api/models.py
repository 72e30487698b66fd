"""Wire models of the trajectory API (PROTOCOL.md) and the checks pydantic cannot express.

Field names and types are the Atropos contract. Cross-field rules (shapes that must
agree, finite scores, messages with role/content) live in `group_errors`, which
returns errors in FastAPI's 422 format so each one names the offending field.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from atroposlib.token_limit import exceeds_token_limit


class Registration(BaseModel):
    """What a trainer sends to `/register`."""

    wandb_group: str
    wandb_project: str
    batch_size: int = Field(gt=0)
    max_token_len: int
    checkpoint_dir: str
    save_checkpoint_interval: int
    starting_step: int = Field(ge=0)
    num_steps: int


class RegisterEnv(BaseModel):
    """What an environment sends to `/register-env`."""

    max_token_length: int
    desired_name: str
    weight: float = 1.0
    group_size: int = Field(gt=0)
    min_batch_allocation: float | None = Field(default=None, ge=0.0, le=1.0)


class EnvIdentifier(BaseModel):
    env_id: int = Field(ge=0)


class ScoredData(BaseModel):
    """One group: the rollouts of one prompt.

    Strict types: a token must be a JSON integer and a score a JSON number, because
    the posted JSON itself is what the trainer receives (see `stored_json`), so a
    coerced "5" would reach it as a string. Unknown keys are kept and handed on.
    `ser_json_inf_nan="constants"` writes NaN/Infinity like Python's json module.
    """

    model_config = ConfigDict(strict=True, extra="allow", ser_json_inf_nan="constants")

    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    advantages: list[list[float]] | None = None
    ref_logprobs: list[list[float]] | None = None
    messages: list[list[dict[str, Any]]] | None = None
    generation_params: dict[str, Any] | None = None
    inference_logprobs: list[list[float]] | None = None
    overrides: list[dict[str, Any]] | None = None
    group_overrides: dict[str, Any] | None = None
    images: Any | None = None
    env_id: int | None = None
    distill_token_ids: list[list[list[int]]] | None = None
    distill_logprobs: list[list[list[float]]] | None = None

    def stored_json(self, raw: bytes | None = None) -> bytes:
        """The JSON handed to the trainer: the posted object with absent fields as null.

        Re-serialising a 100 KB group costs more than validating it, so when the raw
        posted object is at hand it is reused verbatim and only the missing keys are
        prepended. Without it (list posts) the model is serialised.
        """
        if raw is None:
            return self.model_dump_json().encode()
        missing = b"".join(
            _NULL_FIELDS[name] for name in _FIELD_NAMES if name not in self.model_fields_set
        )
        return b"{" + missing + raw.strip()[1:]


_FIELD_NAMES = tuple(ScoredData.model_fields)
_NULL_FIELDS = {name: f'"{name}":null,'.encode() for name in _FIELD_NAMES}
SCORED_DATA_LIST = TypeAdapter(list[ScoredData])

# Optional fields that hold one entry per sequence.
PER_SEQUENCE_FIELDS = (
    "advantages",
    "ref_logprobs",
    "messages",
    "inference_logprobs",
    "overrides",
    "distill_token_ids",
    "distill_logprobs",
)


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
        if value is not None and len(value) != n:
            errors.append(
                _error((*loc, field), f"{field} has {len(value)} entries for {n} sequences")
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


EMPTY_EXAMPLE: dict[str, list] = {
    key: []
    for key in (
        "tokens",
        "masks",
        "scores",
        "advantages",
        "ref_logprobs",
        "generation_params",
        "inference_logprobs",
        "messages",
        "images",
    )
}
