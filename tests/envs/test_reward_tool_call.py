"""The "tool_call" reward: exact hermes calls, order-free, JSON-normalised, nothing else."""

from __future__ import annotations

import json

import pytest

from atroposlib.envs.reward_fns import registry
from atroposlib.envs.reward_fns.tool_call_reward import (
    ToolCallReward,
    calls_match,
    message_calls,
    parse_tool_calls,
    read_gold_calls,
    tool_call_score,
)

WEATHER = {"name": "get_weather", "arguments": {"city": "Oslo", "days": 3, "metric": True}}
RATE = {"name": "convert_currency", "arguments": {"amount": 12, "from": "EUR", "to": "USD"}}
GOLD = "\n".join(f"<tool_call>\n{json.dumps(call)}\n</tool_call>" for call in (WEATHER, RATE))


def block(call: dict | str) -> str:
    body = call if isinstance(call, str) else json.dumps(call)
    return f"<tool_call>\n{body}\n</tool_call>"


def with_args(call: dict, **changes) -> dict:
    return {"name": call["name"], "arguments": {**call["arguments"], **changes}}


@pytest.fixture
def reward() -> ToolCallReward:
    return registry.create("tool_call", gold_calls=GOLD)


def test_the_registry_builds_it_by_name():
    assert isinstance(registry.create({"type": "tool_call", "gold_calls": GOLD}), ToolCallReward)


def test_right_calls_score_one_in_any_order_and_number_spelling(reward):
    reordered = {
        "name": "convert_currency",
        "arguments": {"to": "USD", "amount": 12.0, "from": "EUR"},
    }
    answers = [
        GOLD,
        block(reordered) + block(WEATHER),  # parallel calls are a set; 12.0 == 12
        "Let me look both up.\n" + block(WEATHER) + "\n" + block(RATE),  # prose before
        "<think>weather first, then money</think>\n" + GOLD,
        block(json.dumps({"arguments": WEATHER["arguments"], "name": "get_weather"})) + block(RATE),
    ]
    assert reward(answers) == [1.0] * len(answers)


def test_wrong_name_wrong_args_extra_and_missing_calls_score_zero(reward):
    answers = [
        block({**WEATHER, "name": "get_forecast"}) + block(RATE),  # wrong name
        block(with_args(WEATHER, city="Bergen")) + block(RATE),  # wrong value
        block(with_args(WEATHER, days="3")) + block(RATE),  # "3" is not 3
        block(with_args(WEATHER, metric=1)) + block(RATE),  # 1 is not true
        block(with_args(WEATHER, hourly=True)) + block(RATE),  # an extra argument
        block({"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}) + block(RATE),
        block(WEATHER),  # a missing call
        GOLD + block(RATE),  # an extra (repeated) call
    ]
    assert reward(answers) == [0.0] * len(answers)


def test_calls_hidden_in_the_reasoning_are_not_made(reward):
    answers = [
        f"<think>I will call {GOLD}</think>The weather is fine.",
        f"<think>{GOLD}",  # never leaves the reasoning
        f"<think>plan</think>{block(WEATHER)}<think>{block(RATE)}</think>",
    ]
    assert reward(answers) == [0.0, 0.0, 0.0]


def test_prose_json_malformed_and_empty_score_zero(reward):
    answers = [
        f"I would call {json.dumps(WEATHER)} and then {json.dumps(RATE)}.",  # not in blocks
        f"```json\n{json.dumps([WEATHER, RATE])}\n```",
        block("{'name': 'get_weather', 'arguments': {'city': 'Oslo'}}") + block(RATE),  # Python
        block('{"name": "get_weather", "arguments": {"city": "Oslo"') + block(RATE),  # broken
        block({"name": "get_weather", "arguments": "not json"}) + block(RATE),
        block({"arguments": {"city": "Oslo"}}) + block(RATE),  # no name
        block(WEATHER) + block(RATE) + block("{}"),  # one bad block voids the reply
        "",
        "   ",
    ]
    assert reward(answers) == [0.0] * len(answers)
    assert parse_tool_calls(answers[2]) is None and parse_tool_calls(answers[0]) == []


def test_over_long_outputs_score_zero(reward):
    cut_off = GOLD + "\n<tool_call>\n" + '{"name": "get_weather", "arguments": {"city": "Os'
    flood = "\n".join([block(WEATHER), block(RATE)] * 200)
    assert reward([cut_off, flood]) == [0.0, 0.0]
    # a long answer is fine as long as the calls are exactly right
    assert reward(["Thinking aloud. " * 2000 + GOLD]) == [1.0]


def test_gold_is_read_leniently_and_in_several_shapes():
    python_literal = (
        "<tool_call>\n{'name': 'get_weather', 'arguments': {'city': 'Oslo'}}\n</tool_call>"
    )
    assert read_gold_calls(python_literal) == [
        {"name": "get_weather", "arguments": {"city": "Oslo"}}
    ]
    openai = [
        {
            "type": "function",
            "function": {"name": "convert_currency", "arguments": json.dumps(RATE["arguments"])},
        }
    ]
    assert read_gold_calls(openai) == [RATE]
    assert read_gold_calls(json.dumps(RATE)) == [RATE]
    with pytest.raises(ValueError):
        read_gold_calls("no calls here")


def test_structured_tool_calls_from_a_server_with_a_parser():
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps(WEATHER["arguments"])},
            },
            {
                "id": "c2",
                "type": "function",
                "function": {
                    "name": "convert_currency",
                    "arguments": '{"amount": 12.0, "from": "EUR", "to": "USD"}',
                },
            },
        ],
    }
    assert message_calls(message) == [
        WEATHER,
        {**RATE, "arguments": {**RATE["arguments"], "amount": 12.0}},
    ]
    assert tool_call_score(message, read_gold_calls(GOLD)) == 1.0
    half = {"role": "assistant", "content": block(RATE), "tool_calls": message["tool_calls"][:1]}
    # calls left in the text count as well
    assert tool_call_score(half, read_gold_calls(GOLD)) == 1.0
    assert ToolCallReward(gold_calls=GOLD).compute([{"message": message}, [message]]) == [1.0, 1.0]


def test_upstream_rule_ignores_extra_arguments_when_not_strict():
    extra = [with_args(WEATHER, hourly=True), RATE]
    assert not calls_match(extra, read_gold_calls(GOLD))
    assert calls_match(extra, read_gold_calls(GOLD), strict_arguments=False)
    assert not calls_match([with_args(WEATHER, city="Rome"), RATE], read_gold_calls(GOLD), False)
    lenient = registry.create("tool_call", gold_calls=GOLD, strict_arguments=False)
    assert lenient([block(extra[0]) + block(RATE)]) == [1.0]


def test_weight_scales_and_missing_gold_scores_zero_with_the_reason(caplog):
    assert registry.create("tool_call", gold_calls=GOLD, weight=0.5)([GOLD]) == [0.5]
    assert ToolCallReward().compute([GOLD]) == [0.0]
    # a message is logged once per process: this gold is seen by no other test
    unreadable = "no calls in this gold (test_reward_tool_call)"
    assert ToolCallReward(gold_calls=unreadable).compute([GOLD, "x"]) == [0.0, 0.0]
    messages = [r.message for r in caplog.records]
    assert any("gold calls cannot be read" in m and unreadable[:20] in m for m in messages)


def test_vllms_hermes_rule_decides_which_calls_were_made(reward):
    """vLLM 0.32.0 vllm/tool_parsers/hermes_tool_parser.py:38-40, 70-120."""
    weather_with_tag = with_args(WEATHER, city="Oslo <tool_call> harbour")
    assert parse_tool_calls(block(weather_with_tag)) == [weather_with_tag]
    no_arguments = block({"name": "get_weather"})
    assert parse_tool_calls(no_arguments) is None  # KeyError in vLLM: no calls at all
    assert parse_tool_calls(no_arguments + block(RATE)) is None
    left_open = block(WEATHER) + "<tool_call>" + json.dumps(RATE)  # the last block unclosed
    assert reward([left_open]) == [1.0]
    closer_in_string = block(with_args(WEATHER, city="a </tool_call> b"))
    assert parse_tool_calls(closer_in_string) is None  # the block ends inside the string
    as_string = block({**WEATHER, "arguments": json.dumps(WEATHER["arguments"])})
    assert parse_tool_calls(as_string)[0]["arguments"] == json.dumps(WEATHER["arguments"])
    assert reward([as_string + block(RATE)]) == [0.0]  # a string is not the gold object
    assert parse_tool_calls(block({"name": 7, "arguments": {}})) is None
    assert parse_tool_calls("prose <tool_call> with no JSON") is None
