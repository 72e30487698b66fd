"""Chat messages to the prompt text `ManagedServer` samples from.

Multi-turn node extension needs the re-rendered conversation to start with the text
already sampled, so two template behaviours are worked around here:

- templates that drop `<think>` blocks from earlier assistant turns (Qwen3): the
  blocks are swapped for placeholders while rendering, unless the caller opts out
  with `preserve_think_blocks=True` (upstream's flag; with it the template's own
  handling applies);
- templates that ignore `tools=` (checked once per tokenizer by rendering a probe
  tool): the tools go into the system prompt in hermes form instead and tool results
  become `<tool_response>` user turns, so a tool-less template still shows the model
  its tools. Templates that render tools get them through `apply_chat_template`.
"""

from __future__ import annotations

from typing import Any

from atroposlib.envs.server_handling.tool_call_translator import messages_with_tool_block, plain

THINK_OPEN = "__MNGD_THINK__"
THINK_CLOSE = "__MNGD_ENDTHINK__"
PROBE_TOOL = "atropos_probe_tool_7f3a"


def protect_think_blocks(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant contents with `<think>` tags replaced by placeholders."""
    out = []
    for message in messages:
        content = message.get("content")
        if message.get("role") == "assistant" and isinstance(content, str) and "<think>" in content:
            content = content.replace("<think>", THINK_OPEN).replace("</think>", THINK_CLOSE)
            message = {**message, "content": content}
        out.append(message)
    return out


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether `apply_chat_template(..., tools=...)` puts the tools in the prompt."""
    probe = {
        "type": "function",
        "function": {
            "name": PROBE_TOOL,
            "description": "probe",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}],
            tools=[probe],
            tokenize=False,
            add_generation_prompt=True,
        )
    except Exception:  # a template that rejects tools cannot render them
        return False
    return PROBE_TOOL in text


def render_prompt(
    tokenizer: Any,
    messages: list[Any],
    tools: list[dict[str, Any]] | None = None,
    native_tools: bool = True,
    preserve_think_blocks: bool = False,
) -> str:
    """The prompt for `messages`; a generation prompt follows unless the last is assistant.

    `native_tools`: pass `tools` to the template (else the hermes system-block fallback).
    """
    messages = [plain(m) for m in messages]
    if not hasattr(tokenizer, "apply_chat_template"):
        return "\n".join(f"{m.get('role')}: {m.get('content') or ''}" for m in messages)
    add_generation_prompt = not messages or messages[-1].get("role") != "assistant"
    if not preserve_think_blocks:
        messages = protect_think_blocks(messages)
    options: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
    if tools and native_tools:
        options["tools"] = [plain(t) for t in tools]
    elif tools:
        messages = messages_with_tool_block(messages, tools)
    text = tokenizer.apply_chat_template(messages, **options)
    return text.replace(THINK_OPEN, "<think>").replace(THINK_CLOSE, "</think>")
