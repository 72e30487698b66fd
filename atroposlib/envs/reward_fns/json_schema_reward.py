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
- **Validation.** `jsonschema` (Draft 2020-12 with format checks) when it is installed;
  otherwise the validator here, which covers what pydantic's `model_json_schema()`
  emits: `type`, `enum`, `const`, `properties`/`required`/`additionalProperties`,
  `items`/`prefixItems`, length, size and range bounds, `pattern`, `multipleOf`,
  `anyOf`/`oneOf`/`allOf`/`not`, local `$ref` into `$defs`, and the `date`, `date-time`,
  `time`, `email`, `uuid` and `uri` formats. Other keywords are ignored. `true` is not an
  integer, and 3.0 is one (JSON Schema's rule). A pydantic `model` may be passed too; the
  answer must then also pass `model.model_validate` (custom validators included).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterator
from datetime import date, datetime, time
from typing import Any
from uuid import UUID

from ._ifeval_checks import response_text
from .registry import registry
from .reward_function import RewardFunction

logger = logging.getLogger(__name__)

JSON_OUTPUT = re.compile(r"<json_output>(.*?)</json_output>", re.DOTALL | re.IGNORECASE)
FENCE = re.compile(r"```(?:json|JSON)?[ \t]*\n(.*?)```", re.DOTALL)
EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:\S+")
_NO_JSON = object()


def extract_json_text(completion: str) -> str:
    """The text that should be the JSON answer (see the module docstring)."""
    response = response_text(completion)
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


def _is_type(value: Any, kind: str) -> bool:
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "array":
        return isinstance(value, list)
    if kind == "object":
        return isinstance(value, dict)
    return True


def _format_ok(value: str, fmt: str) -> bool:
    parsers = {
        "date": date.fromisoformat,
        "date-time": lambda v: datetime.fromisoformat(v.replace("Z", "+00:00")),
        "time": lambda v: time.fromisoformat(v.replace("Z", "+00:00")),
        "uuid": UUID,
    }
    if fmt in parsers:
        try:
            parsers[fmt](value)
        except ValueError:
            return False
        return True
    if fmt == "email":
        return EMAIL.fullmatch(value) is not None
    if fmt in ("uri", "url"):
        return URI.fullmatch(value) is not None
    return True


def _resolve(ref: str, root: dict[str, Any]) -> dict[str, Any]:
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        raise ValueError(f"only local $refs are supported, not {ref!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _errors(value: Any, schema: Any, root: dict[str, Any], path: str) -> Iterator[str]:
    """Every way `value` breaks `schema` (the built-in validator)."""
    if schema is True or schema == {}:
        return
    if schema is False:
        yield f"{path}: no value is allowed here"
        return
    if "$ref" in schema:
        yield from _errors(value, _resolve(schema["$ref"], root), root, path)
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_is_type(value, k) for k in kinds):
            yield f"{path}: expected {'/'.join(kinds)}, got {type(value).__name__}"
            return
    if "enum" in schema and not any(_same(value, e) for e in schema["enum"]):
        yield f"{path}: {value!r} is not one of {schema['enum']}"
    if "const" in schema and not _same(value, schema["const"]):
        yield f"{path}: {value!r} is not {schema['const']!r}"
    for keyword in ("allOf", "anyOf", "oneOf"):
        if keyword in schema:
            passing = sum(not any(_errors(value, s, root, path)) for s in schema[keyword])
            wanted = {"allOf": len(schema[keyword]), "oneOf": 1}.get(keyword)
            if (keyword == "anyOf" and passing == 0) or (wanted is not None and passing != wanted):
                yield f"{path}: does not match {keyword}"
    if "not" in schema and not any(_errors(value, schema["not"], root, path)):
        yield f"{path}: matches a schema it must not"
    if isinstance(value, dict):
        yield from _object_errors(value, schema, root, path)
    elif isinstance(value, list):
        yield from _array_errors(value, schema, root, path)
    elif isinstance(value, str):
        yield from _string_errors(value, schema, path)
    elif _is_type(value, "number"):
        yield from _number_errors(value, schema, path)


def _same(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but True is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return a == b


def _object_errors(value: dict, schema: dict, root: dict, path: str) -> Iterator[str]:
    properties = schema.get("properties", {})
    for name in schema.get("required", []):
        if name not in value:
            yield f"{path}: missing required property {name!r}"
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        if name in properties:
            yield from _errors(item, properties[name], root, f"{path}.{name}")
        elif extra is False:
            yield f"{path}: unexpected property {name!r}"
        elif isinstance(extra, dict):
            yield from _errors(item, extra, root, f"{path}.{name}")
    if len(value) < schema.get("minProperties", 0):
        yield f"{path}: too few properties"
    if len(value) > schema.get("maxProperties", math.inf):
        yield f"{path}: too many properties"


def _array_errors(value: list, schema: dict, root: dict, path: str) -> Iterator[str]:
    prefix = schema.get("prefixItems", [])
    for index, item in enumerate(value):
        if index < len(prefix):
            yield from _errors(item, prefix[index], root, f"{path}[{index}]")
        elif "items" in schema:
            yield from _errors(item, schema["items"], root, f"{path}[{index}]")
    if len(value) < schema.get("minItems", 0):
        yield f"{path}: fewer than {schema['minItems']} items"
    if len(value) > schema.get("maxItems", math.inf):
        yield f"{path}: more than {schema['maxItems']} items"
    if schema.get("uniqueItems"):
        seen = [json.dumps(v, sort_keys=True) for v in value]
        if len(set(seen)) != len(seen):
            yield f"{path}: items are not unique"


def _string_errors(value: str, schema: dict, path: str) -> Iterator[str]:
    if len(value) < schema.get("minLength", 0):
        yield f"{path}: shorter than {schema['minLength']}"
    if len(value) > schema.get("maxLength", math.inf):
        yield f"{path}: longer than {schema['maxLength']}"
    if "pattern" in schema and not re.search(schema["pattern"], value):
        yield f"{path}: does not match {schema['pattern']!r}"
    if "format" in schema and not _format_ok(value, schema["format"]):
        yield f"{path}: not a valid {schema['format']}"


def _number_errors(value: float, schema: dict, path: str) -> Iterator[str]:
    if value < schema.get("minimum", -math.inf) or value > schema.get("maximum", math.inf):
        yield f"{path}: {value} is out of range"
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        yield f"{path}: {value} <= {schema['exclusiveMinimum']}"
    if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
        yield f"{path}: {value} >= {schema['exclusiveMaximum']}"
    step = schema.get("multipleOf")
    if step and not math.isclose(value / step, round(value / step), abs_tol=1e-9):
        yield f"{path}: {value} is not a multiple of {step}"


def schema_errors(value: Any, schema: dict[str, Any]) -> list[str]:
    """Why `value` does not validate against `schema` (empty when it does)."""
    try:
        import jsonschema
    except ImportError:
        try:
            return list(_errors(value, schema, schema, "$"))
        except RecursionError:
            return ["$: nested too deeply to validate"]
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    return [error.message for error in validator.iter_errors(value)]


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
        schema = json.loads(schema) if isinstance(schema, str) else schema
        schema = schema if schema is not None else self.schema
        if schema is None:
            raise ValueError("json_schema reward needs a schema")
        return [
            json_schema_score(self.get_content(c), schema, model, self.invalid_schema_score)
            for c in completions
        ]
