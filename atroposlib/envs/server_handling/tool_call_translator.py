"""Tool calls between OpenAI's structured form and the text a model really writes.

Upstream delegates parsing to vLLM's tool parsers; vLLM is not a dependency here,
so the parsers are implemented in this module (hermes: `<tool_call>{json}</tool_call>`,
used by Hermes, Qwen 2.5/3 and most open chat models), and an unknown parser name
is a ValueError that lists the known ones instead of a silent fallback.

Tool calls come back as `ToolCall` objects: plain dicts, as upstream attaches them
(`tc["function"]["name"]`, `json.dumps(tc)` work), that also read like the SDK's
objects (`tc.function.name`, `tc.model_dump()`), so code written either way runs.

The translator remembers, per tool-call id, the exact text that produced the call,
so an assistant message sent back with `tool_calls` re-renders to the very text
the model wrote and a multi-turn prompt keeps extending the same token sequence.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

VLLM_AVAILABLE = importlib.util.find_spec("vllm") is not None  # upstream's flag; unused here


class AttrDict(dict):
    """A dict whose keys also read as attributes (nested dicts too)."""

    def __getattr__(self, name: str) -> Any:
        try:
            value = self[name]
        except KeyError:
            raise AttributeError(name) from None
        return AttrDict(value) if isinstance(value, dict) and type(value) is dict else value

    def model_dump(self, **_: Any) -> dict[str, Any]:
        """A deep plain-dict copy, like a pydantic model's `model_dump()`."""
        return json.loads(json.dumps(self))

    def __deepcopy__(self, memo: dict) -> AttrDict:
        return type(self)(copy.deepcopy(dict(self), memo))


class ToolCall(AttrDict):
    """One OpenAI tool call: {"id", "type": "function", "function": {"name", "arguments"}}."""

    @classmethod
    def create(cls, name: str, arguments: str, call_id: str | None = None) -> ToolCall:
        function = AttrDict(name=name, arguments=arguments)
        return cls(
            id=call_id or f"call_{uuid.uuid4().hex[:24]}", type="function", function=function
        )


@dataclass(frozen=True)
class HermesParser:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call."""

    start_tag: str = "<tool_call>"
    end_tag: str = "</tool_call>"

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]] | None:
        """(content before the first call, calls), or None when `text` holds no valid call.

        A last block left unclosed (the model stopped right after the JSON) still counts;
        any block that is not a JSON object with a string "name" voids the whole parse.
        """
        if self.start_tag not in text:
            return None
        start, end = re.escape(self.start_tag), re.escape(self.end_tag)
        pattern = re.compile(f"{start}(.*?){end}|{start}(.*)", re.DOTALL)
        calls = []
        for closed, unclosed in pattern.findall(text):
            try:
                body = json.loads(closed or unclosed)
            except json.JSONDecodeError:
                return None
            if not isinstance(body, dict) or not isinstance(body.get("name"), str):
                return None
            calls.append(ToolCall.create(body["name"], _arguments_text(body.get("arguments"))))
        if not calls:
            return None
        content = text[: text.index(self.start_tag)]
        return (content if content.strip() else None), calls

    def render(self, calls: list[dict[str, Any]]) -> str:
        """Best-effort text for calls whose original text is unknown."""
        blocks = []
        for call in calls:
            function = call.get("function") or {}
            arguments = function.get("arguments", "{}")
            try:
                arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
            except json.JSONDecodeError:
                pass
            body = json.dumps({"name": function.get("name", ""), "arguments": arguments})
            blocks.append(f"{self.start_tag}\n{body}\n{self.end_tag}")
        return "\n".join(blocks)


TOOL_PARSERS: dict[str, HermesParser] = {"hermes": HermesParser()}


def _arguments_text(arguments: Any) -> str:
    """OpenAI carries arguments as a JSON string; models write an object (or, rarely, text)."""
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        try:
            json.loads(arguments)
            return arguments
        except json.JSONDecodeError:
            pass
    return json.dumps(arguments, ensure_ascii=False)


def plain(value: Any) -> Any:
    """A message or tool call as plain dicts (SDK and pydantic objects included)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(exclude_none=True)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


class ToolCallTranslator:
    def __init__(self, tokenizer: Any, parser_name: str = "hermes") -> None:
        """ValueError when `parser_name` is not one of `TOOL_PARSERS`."""
        if parser_name not in TOOL_PARSERS:
            raise ValueError(
                f"unknown tool parser {parser_name!r}; available here: "
                f"{', '.join(sorted(TOOL_PARSERS))} (vLLM's other parsers are not bundled)"
            )
        self.tokenizer = tokenizer
        self.parser_name = parser_name
        self.parser = TOOL_PARSERS[parser_name]
        self.call_id_to_raw_text: dict[str, str] = {}

    def parse_model_output(
        self,
        raw_text: str,
        tool_choice: str | None = None,
        tools: list[dict] | None = None,
    ) -> tuple[str | None, list[ToolCall] | None, str]:
        """(content, tool_calls, finish_reason) for a completion's text.

        Without tools, or with tool_choice "none", the text comes back unparsed with
        finish_reason "stop"; otherwise "tool_calls" when calls were found.
        """
        if tool_choice == "none" or not tools:
            return raw_text, None, "stop"
        parsed = self.parser.parse(raw_text)
        if parsed is None:
            return raw_text, None, "stop"
        content, calls = parsed
        for call in calls:
            self.call_id_to_raw_text[call["id"]] = raw_text
        return content, calls, "tool_calls"

    def reconstruct_raw_text_from_tool_calls(self, tool_calls: list[Any]) -> str:
        """The text that produced `tool_calls`: remembered exactly, else rebuilt."""
        if not tool_calls:
            return ""
        calls = [plain(call) for call in tool_calls]
        remembered = self.call_id_to_raw_text.get(calls[0].get("id", ""))
        return remembered if remembered is not None else self.parser.render(calls)

    def convert_messages_for_template(self, messages: list[Any]) -> list[dict[str, Any]]:
        """Messages with each assistant `tool_calls` turned back into the model's text."""
        converted = []
        for message in messages:
            message = plain(message)
            calls = message.get("tool_calls")
            if message.get("role") != "assistant" or not calls:
                converted.append(message)
                continue
            exact = plain(calls[0]).get("id", "") in self.call_id_to_raw_text
            text = self.reconstruct_raw_text_from_tool_calls(calls)
            if not exact and message.get("content"):
                text = f"{message['content']}\n{text}"
            rest = {k: v for k, v in message.items() if k not in ("tool_calls", "content")}
            converted.append({**rest, "role": "assistant", "content": text})
        return converted

    def decode_with_tool_awareness(self, token_ids: list[int], has_tools: bool = False) -> str:
        """Text of `token_ids` without special tokens, except the parser's own tags.

        Some tokenizers mark `<tool_call>` special; dropping it would hide the call.
        """
        if not has_tools:
            return self.tokenizer.decode(token_ids, skip_special_tokens=True)
        special = set(getattr(self.tokenizer, "all_special_ids", None) or [])
        tags = (self.parser.start_tag, self.parser.end_tag)
        kept = {i for i in special if self.tokenizer.convert_ids_to_tokens(i) in tags}
        ids = [t for t in token_ids if t not in special or t in kept]
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def tool_system_block(tools: list[dict[str, Any]]) -> str:
    """Hermes-style instructions for a chat template that cannot render tools itself."""
    signatures = "\n".join(json.dumps(plain(tool), ensure_ascii=False) for tool in tools)
    return (
        "# Tools\n\n"
        "You can call functions to help with the user's request. Their signatures, one "
        "JSON object per line, are inside <tools></tools>:\n"
        f"<tools>\n{signatures}\n</tools>\n\n"
        "To call a function, write a JSON object with its name and arguments inside "
        "<tool_call></tool_call> tags, one block per call:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <arguments-object>}\n</tool_call>'
    )


def messages_with_tool_block(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The fallback rendering: tools in the system prompt, tool results as user turns
    wrapped in `<tool_response>` (consecutive results share one turn), as hermes does."""
    block = tool_system_block(tools)
    out: list[dict[str, Any]] = []
    if messages and messages[0].get("role") == "system":
        out.append({**messages[0], "content": f"{messages[0].get('content') or ''}\n\n{block}"})
        messages = messages[1:]
    else:
        out.append({"role": "system", "content": block})
    for message in messages:
        if message.get("role") != "tool":
            out.append(message)
            continue
        response = f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"
        if out[-1].get("role") == "user" and out[-1].get("tool_results"):
            out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n{response}"}
        else:
            out.append({"role": "user", "content": response, "tool_results": True})
    return [{k: v for k, v in m.items() if k != "tool_results"} for m in out]
