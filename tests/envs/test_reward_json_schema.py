"""The "json_schema" reward: where the JSON is found, how it is validated, what it scores."""

from __future__ import annotations

import json
from datetime import date
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, model_validator

from atroposlib.envs.reward_fns import registry
from atroposlib.envs.reward_fns.json_schema_reward import (
    NO_JSON,
    JsonSchemaReward,
    extract_json_text,
    json_schema_score,
    parse_answer,
    schema_errors,
)
from tests.support.reward_agreement.compare import json_schema_agreement


class Item(BaseModel):
    name: str = Field(min_length=1)
    qty: int = Field(ge=1)


class Order(BaseModel):
    model_config = ConfigDict(extra="forbid")
    order_id: str = Field(pattern=r"^O[0-9]{3}$")
    status: Literal["open", "closed"]
    placed: date
    items: list[Item] = Field(min_length=1)
    discount: float = Field(0.0, ge=0, lt=1, multiple_of=0.05)
    note: str | None = None

    @model_validator(mode="after")
    def closed_orders_have_a_note(self) -> Order:
        if self.status == "closed" and not self.note:
            raise ValueError("closed orders need a note")
        return self


SCHEMA = Order.model_json_schema()
GOOD = {
    "order_id": "O123",
    "status": "open",
    "placed": "2024-05-01",
    "items": [{"name": "tea", "qty": 2}],
    "discount": 0.1,
}


def variant(**changes) -> str:
    return json.dumps({**GOOD, **changes})


@pytest.fixture
def reward() -> JsonSchemaReward:
    return registry.create("json_schema", schema=SCHEMA)


def test_valid_answers_score_one_in_every_container(reward):
    good = json.dumps(GOOD)
    answers = [
        good,
        f"```json\n{good}\n```",
        f"Here you go:\n```\n{good}\n```\nDone.",
        f"<think>easy</think>\n<json_output>{good}</json_output>",
        f"<think>draft: {{}}</think>\n```json\n{good}\n```",
    ]
    assert reward(answers) == [1.0] * len(answers)


@pytest.mark.parametrize(
    "bad",
    [
        {"order_id": "123"},  # pattern
        {"status": "pending"},  # enum
        {"placed": "last tuesday"},  # date format
        {"items": []},  # minItems
        {"items": [{"name": "tea", "qty": 0}]},  # $ref'd minimum
        {"items": [{"name": "tea", "qty": "2"}]},  # a string is not an integer
        {"items": [{"name": "tea", "qty": True}]},  # nor is true
        {"discount": 1.0},  # exclusiveMaximum
        {"discount": 0.12},  # multipleOf
        {"surprise": 1},  # additionalProperties false
        {"note": 5},  # anyOf string/null
    ],
)
def test_schema_violations_score_the_json_only_credit(reward, bad):
    assert reward([variant(**bad)]) == [0.25]
    assert schema_errors(json.loads(variant(**bad)), SCHEMA)


def test_missing_required_and_wrong_top_level_type(reward):
    missing = {k: v for k, v in GOOD.items() if k != "placed"}
    assert reward([json.dumps(missing), "[1, 2]", '"a string"', "{}"]) == [0.25] * 4


def test_integer_valued_floats_are_integers():
    assert schema_errors(3.0, {"type": "integer"}) == []
    assert schema_errors(3.5, {"type": "integer"})


def test_the_models_own_validators_are_applied_when_a_model_is_given(reward):
    closed = variant(status="closed")
    assert reward([closed]) == [1.0]  # the JSON schema cannot express the rule
    assert reward([closed], model=Order) == [0.25]
    assert reward([variant(status="closed", note="refunded")], model=Order) == [1.0]


def test_no_json_scores_zero(reward):
    good = json.dumps(GOOD)
    answers = [
        "",
        "   ",
        "I cannot help with that.",
        f"Sure! {good}",  # prose around bare JSON
        good[:-1],  # truncated
        f"<think>{good}</think>",  # the answer only in the reasoning
        f"<think>{good}",  # unclosed reasoning: no response at all
        "{'order_id': 'O123'}",  # Python, not JSON
    ]
    assert reward(answers) == [0.0] * len(answers)


def test_the_last_fence_is_the_answer(reward):
    good = json.dumps(GOOD)
    assert extract_json_text(f"```json\n{good}\n```\nfixed:\n```json\n{{}}\n```") == "{}"
    assert reward([f"```json\n{{}}\n```\nfixed:\n```json\n{good}\n```"]) == [1.0]


def test_over_long_output(reward):
    padding = "filler " * 20000
    assert reward([padding + json.dumps(GOOD)]) == [0.0]
    huge = variant(items=[{"name": "tea", "qty": 1}] * 5000)
    assert reward([huge]) == [1.0]
    assert parse_answer("[" * 5000) is NO_JSON


def test_schema_as_a_string_and_a_missing_or_broken_schema_scores_zero():
    reward = JsonSchemaReward()
    assert reward([json.dumps(GOOD)], schema=json.dumps(SCHEMA)) == [1.0]
    assert reward.compute(["{}"]) == [0.0]
    assert reward.compute(["{}", "[]"], schema="{not json") == [0.0, 0.0]
    assert reward.compute(["{}"], schema="[1, 2]") == [0.0]


def test_verdicts_agree_with_the_jsonschema_package_on_hundreds_of_adversarial_cases():
    agreement = json_schema_agreement(n=400, seed=27)
    assert agreement.cases == 400
    assert agreement.disagreements == [], agreement.disagreements[:3]


def test_deep_nesting_is_invalid_not_a_crash(reward):
    deep = "[" * 900 + "]" * 900
    assert reward([deep]) == [0.25]
    assert JsonSchemaReward(schema={"items": {"$ref": "#"}}).compute([deep]) == [0.25]


BIG = "1" + "0" * 400
REVIEWED = [  # (answer, schema, score): issue 27's json_schema findings, each a former bug
    (
        '{"x-1": 5}',
        {"patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False},
        1.0,
    ),
    ('{"1": 5}', {"propertyNames": {"pattern": "^[a-z]+$"}}, 0.25),
    ('{"a": 1}', {"dependentRequired": {"a": ["b"]}}, 0.25),
    ('{"a": 1}', {"dependentSchemas": {"a": {"required": ["b"]}}}, 0.25),
    ('{"a": 1}', {"if": {"required": ["a"]}, "then": {"required": ["b"]}}, 0.25),
    ("[1, 2]", {"contains": {"const": "x"}}, 0.25),
    ('{"a": 1, "b": 2}', {"properties": {"a": {}}, "unevaluatedProperties": False}, 0.25),
    ("[true]", {"enum": [[1]]}, 0.25),
    ('{"a": false}', {"const": {"a": 0}}, 0.25),
    ("[1, true]", {"uniqueItems": True}, 1.0),
    ('"2024-13-45T99:00:00"', {"format": "date-time"}, 0.25),
    ('"2024-02-30"', {"format": "date"}, 0.25),
    ('"25:61:00Z"', {"format": "time"}, 0.25),
    ('"1234-not-a-uuid"', {"format": "uuid"}, 0.25),
    ('"2024-01-05T10:00:00Z"', {"format": "date-time"}, 1.0),
    (BIG, {"type": "number", "multipleOf": 0.1}, 0.25),  # raised OverflowError
    ('{"a": 1}', {"properties": {"a": {"$ref": "#/$defs/missing"}}}, 0.25),
    ('{"a": 1}', {"type": "objectx"}, 0.25),  # an invalid schema, not an exception
]


@pytest.mark.parametrize("answer, schema, score", REVIEWED)
def test_the_reward_agrees_with_jsonschema_on_what_it_used_to_get_wrong(answer, schema, score):
    """jsonschema (Draft 2020-12, format checks) is the one validator now; a hand-written
    one stood in when it was not installed and got each of these wrong."""
    assert json_schema_score(f"```json\n{answer}\n```", schema) == score
