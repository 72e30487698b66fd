"""Seeded adversarial (schema, answer) pairs for the "json_schema" reward.

The reference is the `jsonschema` package's Draft 2020-12 validator with its format
checker, applied to the JSON the reward's documented rule extracts. The pairs are the
families a hand-written validator gets wrong: booleans against 1 and 0 in `enum`,
`const` and `uniqueItems`; formats; `patternProperties`, `propertyNames`,
`dependentRequired`, `dependentSchemas`, `if`/`then`/`else`, `contains`,
`unevaluatedProperties`; huge numbers against `multipleOf`; answers in tags, fences,
prose and reasoning.
"""

from __future__ import annotations

import json
import random
from typing import Any

BIG = int("1" + "0" * 400)
SCHEMAS: list[dict[str, Any]] = [
    {"enum": [1, 0, "a", [1], {"k": 1}]},
    {"const": {"flag": 1}},
    {"type": "array", "uniqueItems": True},
    {"type": "string", "format": "date-time"},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "time"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "format": "email"},
    {"type": "string", "format": "ipv4"},
    {"patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False},
    {"type": "object", "propertyNames": {"maxLength": 3}},
    {"type": "object", "dependentRequired": {"a": ["b"]}},
    {"type": "object", "dependentSchemas": {"a": {"required": ["c"]}}},
    {"if": {"properties": {"k": {"const": 1}}}, "then": {"required": ["v"]}, "else": {}},
    {"type": "array", "contains": {"type": "integer"}, "minContains": 2},
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "unevaluatedProperties": False,
    },
    {"type": "number", "multipleOf": 0.01},
    {"type": "integer", "maximum": 10},
    {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
]
VALUES: list[Any] = [
    True,
    False,
    1,
    0,
    1.0,
    "a",
    [1],
    [True],
    [1, True],
    [0, False],
    [1, 1.0],
    {"k": 1},
    {"flag": True},
    {"flag": 1},
    {"flag": 1.0},
    "2024-02-30T10:00:00Z",
    "2024-01-01T10:00:00Z",
    "2024-01-01",
    "2024-13-01",
    "10:00:00Z",
    "10:00",
    "25:00:00Z",
    "123e4567-e89b-12d3-a456-426614174000",
    "123e4567e89b12d3a456426614174000",
    "a@b.co",
    "not an email",
    "127.0.0.1",
    "256.0.0.1",
    {"x-1": 5},
    {"x-1": "5"},
    {"y": 1},
    {"abcd": 1},
    {"abc": 1},
    {"a": 1},
    {"a": 1, "b": 2},
    {"a": 1, "c": 3},
    {"k": 1},
    {"k": 1, "v": 2},
    {"k": 2},
    [1, "x", 2],
    [1, "x"],
    {"a": 1, "z": 2},
    0.1,
    0.3,
    12.345,
    BIG,
    1e308,
    -1,
    11,
    {"name": "x"},
    {"name": 5},
    {},
    [],
    None,
]


# each family's edge: (schema, the values that probe it)
DIRECTED: list[tuple[dict[str, Any], list[Any]]] = [
    ({"enum": [1, 0]}, [True, False, 1.0, 0]),
    ({"const": {"flag": 1}}, [{"flag": True}, {"flag": 1.0}]),
    ({"uniqueItems": True}, [[1, True], [0, False], [1, 1.0], [[1], [True]]]),
    ({"type": "number", "multipleOf": 0.01}, [BIG, 1e308, 0.3, 12.345]),
    ({"type": "integer", "multipleOf": 3}, [BIG, 9.0, 1e308]),
    ({"type": "string", "format": "date-time"}, ["2024-02-30T10:00:00Z", "2024-01-01 10:00"]),
    ({"type": "string", "format": "uuid"}, ["123e4567e89b12d3a456426614174000"]),
]


def wrap(rng: random.Random, answer: str) -> str:
    """The answer in one of the containers the reward reads, or around prose."""
    return rng.choice(
        [
            answer,
            f"<json_output>{answer}</json_output>",
            f"Here it is:\n```json\n{answer}\n```",
            f"```\n{answer}\n```",
            f'<think>{{"draft": 1}}</think>\n{answer}',
            f"The answer is {answer}.",
            f"<think>{answer}",
        ]
    )


def cases(n: int = 400, seed: int = 27) -> list[tuple[dict[str, Any], str]]:
    """(schema, completion) pairs."""
    rng = random.Random(seed)
    made = []
    directed = [(schema, value) for schema, values in DIRECTED for value in values]
    for _ in range(n):
        if rng.random() < 0.3:
            schema, value = rng.choice(directed)
        else:
            schema, value = rng.choice(SCHEMAS), rng.choice(VALUES)
        made.append((schema, wrap(rng, json.dumps(value))))
    return made


def reference_verdict(schema: dict[str, Any], text: str) -> str:
    """'valid', 'invalid', 'no json', or the exception jsonschema raised."""
    from jsonschema import Draft202012Validator

    try:
        value = json.loads(text)
    except ValueError:
        return "no json"
    try:
        validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
        return "valid" if validator.is_valid(value) else "invalid"
    except Exception as error:
        return f"raises {type(error).__name__}"
