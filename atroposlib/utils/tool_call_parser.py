"""Read a hermes-style tool call (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``).

Environments score a model on whether it called a tool well, so a bad call is an
outcome, not a crash: ``parse_tool_call`` never raises and reports failure as
``("-ERROR-", arguments, True)``, the triple Atropos environments unpack.

Small models often write JSON with single quotes. The text is parsed as written
first; only when that fails are single quotes turned into double quotes and the
parse retried (Atropos only tries the second form, which also breaks every
apostrophe inside a string value).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

__all__ = ["ERROR_NAME", "extract_tool_call", "parse_tool_call"]

logger = logging.getLogger(__name__)

ERROR_NAME = "-ERROR-"
DEFAULT_TAGS = ("tool_call",)


def extract_tool_call(text: str, preferred_tags: list[str] | None = None) -> str | None:
    """The stripped content of the first ``<tag>...</tag>`` block, trying tags in order.

    ``preferred_tags`` defaults to ``["tool_call"]``; returns None when no tag matches.
    """
    if not isinstance(text, str):
        return None
    for tag in preferred_tags or DEFAULT_TAGS:
        escaped = re.escape(tag)
        match = re.search(f"<{escaped}>(.*?)</{escaped}>", text, re.DOTALL)
        if match:
            return match.group(1).strip()
    return None


def _load_call(content: str) -> Any:
    try:
        return json.loads(content, strict=False)
    except json.JSONDecodeError:
        return json.loads(content.replace("'", '"'), strict=False)


def _tool_names(available_tools: list[dict]) -> set[str]:
    """Names of tools given either flat (``{"name": ...}``) or OpenAI-style (``function.name``)."""
    names = set()
    for tool in available_tools:
        if not isinstance(tool, dict):
            continue
        if "name" in tool:
            names.add(tool["name"])
        elif isinstance(tool.get("function"), dict) and "name" in tool["function"]:
            names.add(tool["function"]["name"])
    return names


def parse_tool_call(
    response: str,
    available_tools: list[dict] | None = None,
    preferred_tags: list[str] | None = None,
) -> tuple[str, dict[str, Any], bool]:
    """Parse the first tool call in ``response`` into ``(tool_name, arguments, is_error)``.

    On failure the name is ``"-ERROR-"`` and ``is_error`` is True; the arguments are
    ``{}``, except for a well-formed call to a tool missing from ``available_tools``
    (checked only when that list is given), which keeps its parsed arguments.
    """
    content = extract_tool_call(response, preferred_tags)
    if not content:
        logger.warning("No tool call found in response: %.200r", response)
        return ERROR_NAME, {}, True
    try:
        call = _load_call(content)
        if not isinstance(call, dict):
            raise ValueError(f"a tool call must be a JSON object, got {type(call).__name__}")
        name = call.get("name", "")
        arguments = call.get("arguments", {})
    except ValueError as error:  # json.JSONDecodeError is a ValueError
        logger.warning("Could not parse tool call %.200r: %s", content, error)
        return ERROR_NAME, {}, True
    if available_tools and not (
        isinstance(name, str) and name and name in _tool_names(available_tools)
    ):
        logger.warning("Tool call names an unknown tool: %r", name)
        return ERROR_NAME, arguments, True
    return name, arguments, False
