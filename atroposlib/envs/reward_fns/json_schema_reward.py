"""Registered as "json_schema": does a completion answer with JSON that fits a JSON schema?

Design decisions:

- **Partial credit, ordered.** 1.0 when the answer validates; `invalid_schema_score`
  (default 0.25) when it is well-formed JSON that breaks the schema, so a policy first
  learns to write JSON at all; 0.0 when there is no parseable JSON. A valid answer
  always beats any invalid one.
- **Where the answer is.** Only the response after the last `</think>` counts (an
  unclosed `<think>` leaves none, so JSON written while reasoning scores 0.0). Inside the
  response: the last `<json_output>...</json_output>` block (upstream's container), else
  the last ```` ```json ```` (or bare ```` ``` ````) fence, else the whole response, which
  must then be JSON and nothing else (prose around bare JSON is a parse failure).
- **Validation.** The `jsonschema` package is the one validator: Draft 2020-12, every
  keyword, and format checks with its `format-nongpl` extra, which atroposlib depends
  on, so a verdict never depends on what else is installed. (A validator written here
  used to stand in when `jsonschema` was missing; it ignored `patternProperties`,
  `if`/`then`/`else`, `contains` and more, let `true` equal `1` in `enum`, and raised
  `OverflowError` on one input.) A schema that is itself invalid, or a value the
  validator cannot compare, makes the answer invalid rather than raising. A pydantic
  `model` may be passed too; the answer must then also pass `model.model_validate`
  (custom validators included).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from ._final_answer import after_thinking
from .registry import registry
from .reward_function import RewardFunction, log_once

logger = logging.getLogger(__name__)

JSON_OUTPUT = re.compile(r"<json_output>(.*?)</json_output>", re.DOTALL | re.IGNORECASE)
FENCE = re.compile(r"```(?:json|JSON)?[ \t]*\n(.*?)```", re.DOTALL)
_NO_JSON = object()


def extract_json_text(completion: str) -> str:
    """The text that should be the JSON answer (see the module docstring)."""
    response = (after_thinking(completion) or "").strip()
    for pattern in (JSON_OUTPUT, FENCE):
        found = pattern.findall(response)
        if found:
            return found[-1].strip()
    return response


def parse_answer(completion: str) -> Any:
    """The answer's JSON value, or `NO_JSON` when there is none."""
    text = extract_json_text(completion)
    if not text:
        return _NO_JSON
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
        return _NO_JSON


NO_JSON = _NO_JSON


def schema_errors(value: Any, schema: dict[str, Any]) -> list[str]:
    """Why `value` does not validate against `schema` (empty when it does).

    A schema that is itself invalid, or a value the validator cannot handle (an integer
    too large for a float comparison, nesting too deep), is an error, not an exception.
    `jsonschema` is imported here, on first use: its format checks build an IRI grammar
    at import (about 3 s of CPU), which no process that never grades JSON should pay.
    """
    from jsonschema import Draft202012Validator, SchemaError
    from referencing.exceptions import Unresolvable

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return [f"the schema is invalid: {exc.message}"]
    try:
        validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
        return [error.message for error in validator.iter_errors(value)]
    except Unresolvable as exc:
        return [f"the schema's $ref cannot be resolved: {exc}"]
    except (OverflowError, RecursionError, ValueError, TypeError) as exc:
        return [f"cannot validate: {type(exc).__name__}: {exc}"]


def json_schema_score(
    completion: str,
    schema: dict[str, Any],
    model: Any = None,
    invalid_schema_score: float = 0.25,
) -> float:
    """1.0 valid, `invalid_schema_score` for schema-breaking JSON, 0.0 for no JSON."""
    value = parse_answer(completion)
    if value is NO_JSON:
        return 0.0
    if schema_errors(value, schema):
        return invalid_schema_score
    if model is not None:
        try:
            model.model_validate(value)
        except ValueError:  # pydantic's ValidationError is a ValueError
            return invalid_schema_score
    return 1.0


@registry.register(name="json_schema")
class JsonSchemaReward(RewardFunction):
    """Scores JSON answers against a schema; see the module docstring for the rules."""

    def __init__(
        self,
        schema: dict[str, Any] | str | None = None,
        invalid_schema_score: float = 0.25,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.schema = json.loads(schema) if isinstance(schema, str) else schema
        self.invalid_schema_score = invalid_schema_score

    def compute(
        self,
        completions: list[Any],
        schema: dict[str, Any] | str | None = None,
        model: Any = None,
        **kwargs: Any,
    ) -> list[float]:
        """Score each completion against `schema` (or the one given at construction)."""
        try:
            schema = json.loads(schema) if isinstance(schema, str) else schema
            schema = schema if schema is not None else self.schema
            if not isinstance(schema, dict | bool):
                raise ValueError(f"the schema must be a JSON object or boolean, got {schema!r}")
        except (ValueError, RecursionError) as error:
            log_once(logger, f"json_schema: no usable schema, scoring 0.0: {error}")
            return [0.0] * len(completions)
        return self.score_each(
            completions,
            lambda text: json_schema_score(text, schema, model, self.invalid_schema_score),
        )
