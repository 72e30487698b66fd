"""Registered as "tool_call": did a completion make exactly the expected hermes tool calls?

A call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the hermes format
(Hermes, Qwen 2.5/3 and most open chat models write it; `ManagedServer` with
`tool_parser="hermes"` and vLLM's hermes parser read it). Design decisions:

- **All or nothing, as upstream's tool_calling_server.** 1.0 when the completion's calls
  are exactly the gold calls, else 0.0. Order does not matter (parallel calls are a set;
  a repeated call must be repeated), but an extra call, a missing call, a wrong name or a
  wrong argument fails. Partial credit per call would pay a policy for spraying calls.
- **Arguments compare as JSON values, strictly.** Key order is ignored and `12` equals
  `12.0` (JSON has one number type), but `true` is not `1` and `"12"` is not `12`. Unlike
  upstream, an argument the gold call does not have fails too: an extra argument changes
  what the call does (a filter, a limit), and the tool's schema says what is allowed.
  `strict_arguments=False` restores upstream's rule (gold arguments must be present and
  equal; extra ones are ignored).
- **Which calls were made: vLLM's hermes rule** (vLLM 0.32.0,
  `vllm/tool_parsers/hermes_tool_parser.py`, lines 38-40 and 70-120), so a call scores
  only if a server running `--tool-call-parser hermes` would have executed it. With no
  `<tool_call>` the reply makes no call. Otherwise every match of
  `<tool_call>(.*?)</tool_call>|<tool_call>(.*)` (a final block may be left open) must
  be a JSON object with a string `name` and an `arguments` key; if any is not, vLLM
  returns no calls at all and the reply scores 0.0. So a literal `<tool_call>` inside
  a string argument is fine, a `</tool_call>` inside one breaks the block, a call with
  no `arguments` is no call, and arguments given as a JSON string stay a string (and do
  not equal the gold object). Prose before, between and after the blocks is allowed.
- **Deliberate difference: calls are read after the reasoning.** Only the text after
  the last `</think>` counts, and an unclosed `<think>` leaves none, as when vLLM runs
  with a reasoning parser, which hands the tool parser the content only; a call
  written while reasoning is not made.
- **The gold side is read leniently** (Python-literal dicts, arguments given as a JSON
  string), since datasets store both.
- **Structured calls.** An OpenAI-style message (`tool_calls` with `function.name` and
  `function.arguments` as a JSON string), as a server with a tool parser answers, is
  scored by the same rules (`message_calls`).
"""

from __future__ import annotations

import ast
import json
import logging
import re
from collections import Counter
from typing import Any

from ._final_answer import after_thinking
from .registry import registry
from .reward_function import RewardFunction, log_once

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
# vLLM's Hermes2ProToolParser.tool_call_regex: closed blocks, or an open one to the end
HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)

Call = dict[str, Any]  # {"name": str, "arguments": dict}
logger = logging.getLogger(__name__)


def response_part(completion: str) -> str:
    """The text after the last `</think>`; "" when a `<think>` is never closed."""
    return after_thinking(completion) or ""


def hermes_calls(text: str) -> list[Call] | None:
    """The calls vLLM's hermes parser extracts from `text`; [] for none, None if it fails.

    The parser's own failure (any block not a JSON object with `name` and `arguments`)
    returns no calls; None here tells that apart from a reply that made none.
    """
    if TOOL_CALL_OPEN not in text:
        return []
    calls = []
    for closed, open_ended in HERMES_CALL.findall(text):
        try:
            body = json.loads(closed or open_ended)
        except (ValueError, RecursionError):
            return None
        if not isinstance(body, dict) or "arguments" not in body:
            return None
        if not isinstance(body.get("name"), str):  # vLLM's FunctionCall(name: str)
            return None
        calls.append({"name": body["name"], "arguments": body["arguments"]})
    return calls


def _call_from_body(body: Any) -> Call | None:
    """A gold or structured call: {"name", "arguments"}, arguments decoded if a string."""
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        return None
    arguments = body.get("arguments", {})
    if isinstance(arguments, str):  # double-encoded, as OpenAI's wire format carries it
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return {"name": body["name"], "arguments": arguments}


def parse_gold_blocks(text: str) -> list[Call] | None:
    """Every `<tool_call>` block of gold text as a call, JSON or a Python literal."""
    calls = []
    for body in TOOL_CALL_BLOCK.findall(text):
        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError):
            try:
                parsed = ast.literal_eval(body.strip())
            except (ValueError, SyntaxError, RecursionError, MemoryError):
                return None
        call = _call_from_body(parsed)
        if call is None:
            return None
        calls.append(call)
    return calls


def parse_tool_calls(completion: str) -> list[Call] | None:
    """The calls a completion makes (its response part); [] for none, None if malformed."""
    return hermes_calls(response_part(completion))


def canonical(value: Any) -> Any:
    """A JSON value in a form where equal values compare equal (12 == 12.0, key order)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    return str(value)


def _key(call: Call) -> str:
    return json.dumps(
        {"name": call["name"], "arguments": canonical(call["arguments"])}, sort_keys=True
    )


def _argument_subset(predicted: Call, gold: Call) -> bool:
    """Upstream's rule: same name, every gold argument present and equal."""
    args = canonical(predicted["arguments"])
    if predicted["name"] != gold["name"] or not isinstance(args, dict):
        return False
    return all(
        name in args and json.dumps(args[name], sort_keys=True) == json.dumps(value, sort_keys=True)
        for name, value in canonical(gold["arguments"]).items()
    )


def calls_match(predicted: list[Call], gold: list[Call], strict_arguments: bool = True) -> bool:
    """Whether the predicted calls are the gold calls, in any order (see module doc)."""
    if not gold or len(predicted) != len(gold):
        return False
    if strict_arguments:
        return Counter(map(_key, predicted)) == Counter(map(_key, gold))
    remaining = list(gold)
    for call in predicted:
        found = next((i for i, g in enumerate(remaining) if _argument_subset(call, g)), None)
        if found is None:
            return False
        remaining.pop(found)
    return True


def read_gold_calls(gold: Any) -> list[Call]:
    """Gold calls from `<tool_call>` text, a JSON string, a call, or a list of calls.

    Calls may be plain ({"name", "arguments"}) or OpenAI-shaped ({"function": {...}}).
    ValueError when nothing usable is found.
    """
    if isinstance(gold, str):
        if TOOL_CALL_OPEN in gold:
            calls = parse_gold_blocks(gold)
            if not calls:
                raise ValueError(f"gold tool calls do not parse: {gold[:200]!r}")
            return calls
        try:
            gold = json.loads(gold)
        except ValueError as error:
            raise ValueError(
                f"gold tool calls are neither blocks nor JSON: {gold[:200]!r}"
            ) from error
    items = gold if isinstance(gold, list) else [gold]
    calls = []
    for item in items:
        call = _call_from_body(item.get("function", item) if isinstance(item, dict) else item)
        if call is None:
            raise ValueError(f"not a tool call: {item!r}")
        calls.append(call)
    if not calls:
        raise ValueError("no gold tool calls")
    return calls


def message_calls(message: Any) -> list[Call] | None:
    """Calls of an assistant message: its structured `tool_calls` plus any blocks in its
    text content (a server without a tool parser leaves them there); None if malformed."""
    if isinstance(message, str):
        return parse_tool_calls(message)
    get = message.get if isinstance(message, dict) else lambda k, d=None: getattr(message, k, d)
    calls: list[Call] = []
    for tool_call in get("tool_calls", None) or []:
        function = tool_call["function"] if isinstance(tool_call, dict) else tool_call.function
        name = function["name"] if isinstance(function, dict) else function.name
        args = function["arguments"] if isinstance(function, dict) else function.arguments
        call = _call_from_body({"name": name, "arguments": args})
        if call is None:
            return None
        calls.append(call)
    in_text = parse_tool_calls(get("content", None) or "")
    return None if in_text is None else calls + in_text


def tool_call_score(completion: Any, gold: list[Call], strict_arguments: bool = True) -> float:
    """1.0 when `completion` (text or assistant message) makes exactly the `gold` calls."""
    predicted = message_calls(completion)
    if not predicted:
        return 0.0
    return 1.0 if calls_match(predicted, gold, strict_arguments) else 0.0


def last_assistant_message(completion: Any) -> Any:
    """The message to score: a completion's `message`, or a conversation's last assistant turn."""
    if isinstance(completion, dict) and isinstance(completion.get("message"), dict):
        return completion["message"]
    if isinstance(completion, list):
        turns = [m for m in completion if isinstance(m, dict) and m.get("role") == "assistant"]
        return turns[-1] if turns else ""
    return completion


@registry.register(name="tool_call")
class ToolCallReward(RewardFunction):
    """Exact-match hermes tool calls against gold calls; see the module docstring."""

    def __init__(
        self,
        gold_calls: Any = None,
        strict_arguments: bool = True,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.gold_calls = gold_calls
        self.strict_arguments = strict_arguments

    def compute(self, completions: list[Any], gold_calls: Any = None, **kwargs: Any) -> list[float]:
        """Score each completion (text, or an assistant message with `tool_calls`)."""
        gold = gold_calls if gold_calls is not None else self.gold_calls
        try:
            if gold is None:
                raise ValueError("no gold_calls given")
            expected = read_gold_calls(gold)
        except (ValueError, TypeError, RecursionError) as error:
            log_once(logger, f"tool_call: the gold calls cannot be read, scoring 0.0: {error}")
            return [0.0] * len(completions)
        return self.score_each(
            completions,
            lambda message: tool_call_score(message, expected, self.strict_arguments),
            read=last_assistant_message,
        )
