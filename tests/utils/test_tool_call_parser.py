"""Hermes-style tool calls, parsed as upstream's blackjack and wikipedia environments use them."""

from __future__ import annotations

import json

import pytest

from atroposlib.utils.tool_call_parser import extract_tool_call, parse_tool_call

# The tool list shape of upstream's blackjack environments (OpenAI "function" tools).
BLACKJACK_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "take_action",
            "description": "Choose to 'hit' or 'stick' in Blackjack.",
            "parameters": {"action": {"type": "string", "enum": ["hit", "stick"]}},
        },
    }
]
FLAT_TOOLS = [{"name": "search", "parameters": {}}]


def call(payload: dict | str, tag: str = "tool_call") -> str:
    body = payload if isinstance(payload, str) else json.dumps(payload)
    return f"<{tag}>{body}</{tag}>"


def test_extract_returns_the_first_block_stripped():
    text = '<think>x</think>\n<tool_call>\n  {"a": 1}\n</tool_call> <tool_call>{"b": 2}</tool_call>'
    assert extract_tool_call(text) == '{"a": 1}'


def test_extract_spans_lines_and_tries_tags_in_order():
    text = "<action>\nfirst\nline</action><tool_call>other</tool_call>"
    assert extract_tool_call(text, ["tool_call", "action"]) == "other"
    assert extract_tool_call(text, ["action", "tool_call"]) == "first\nline"
    assert extract_tool_call(text, ["missing"]) is None
    assert extract_tool_call("no tags here") is None
    assert extract_tool_call("<tool_call>unclosed") is None


def test_extract_treats_tag_names_literally():
    assert extract_tool_call("<a.b>x</a.b>", ["a.b"]) == "x"
    assert extract_tool_call("<axb>x</axb>", ["a.b"]) is None


def test_blackjack_call_parses_to_name_and_arguments():
    response = "<think>I have 19.</think>\n" + call(
        {"name": "take_action", "arguments": {"action": "stick"}}
    )
    assert parse_tool_call(response, BLACKJACK_TOOLS, ["tool_call"]) == (
        "take_action",
        {"action": "stick"},
        False,
    )


def test_flat_tool_list_is_accepted_too():
    assert parse_tool_call(call({"name": "search", "arguments": {"q": "x"}}), FLAT_TOOLS) == (
        "search",
        {"q": "x"},
        False,
    )


def test_single_quoted_json_is_accepted():
    response = call("{'name': 'take_action', 'arguments': {'action': 'hit'}}")
    assert parse_tool_call(response, BLACKJACK_TOOLS) == ("take_action", {"action": "hit"}, False)


def test_apostrophes_inside_double_quoted_json_survive():
    payload = {"name": "search", "arguments": {"q": "Rubik's cube"}}
    assert parse_tool_call(call(payload), FLAT_TOOLS) == ("search", {"q": "Rubik's cube"}, False)


def test_control_characters_inside_strings_are_allowed():
    response = call('{"name": "search", "arguments": {"q": "two\nlines"}}')
    assert parse_tool_call(response) == ("search", {"q": "two\nlines"}, False)


def test_missing_keys_default_without_a_tool_list():
    assert parse_tool_call(call({"arguments": {"x": 1}})) == ("", {"x": 1}, False)
    assert parse_tool_call(call({"name": "anything"})) == ("anything", {}, False)


@pytest.mark.parametrize(
    "response",
    [
        "no call at all",
        "<tool_call>   </tool_call>",
        call("{not json"),
        call("[1, 2]"),
        call('"just a string"'),
    ],
)
def test_malformed_calls_are_errors_with_empty_arguments(response):
    assert parse_tool_call(response, BLACKJACK_TOOLS) == ("-ERROR-", {}, True)


def test_unknown_tool_is_an_error_that_keeps_its_arguments():
    response = call({"name": "fold", "arguments": {"action": "fold"}})
    assert parse_tool_call(response, BLACKJACK_TOOLS) == ("-ERROR-", {"action": "fold"}, True)
    nameless = call({"arguments": {"action": "hit"}})
    assert parse_tool_call(nameless, BLACKJACK_TOOLS) == ("-ERROR-", {"action": "hit"}, True)


def test_preferred_tags_select_the_block():
    response = call({"name": "search", "arguments": {}}, tag="function")
    assert parse_tool_call(response) == ("-ERROR-", {}, True)
    assert parse_tool_call(response, FLAT_TOOLS, ["function"]) == ("search", {}, False)
