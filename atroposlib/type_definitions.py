"""Shared type names that environment code imports.

Environments written for Atropos import names such as ``Message``, ``Item`` or
``number`` from ``atroposlib.type_definitions``. They are defined here so that
those environments import unchanged. They are plain typing aliases and
``TypedDict`` shapes: they document what flows between an environment, the
inference server and the trainer, and cost nothing at runtime.
"""

import sys
from typing import Any

if sys.version_info >= (3, 11):
    from typing import NotRequired, TypedDict
else:  # pragma: no cover - Python 3.10
    from typing_extensions import NotRequired, TypedDict

__all__ = [
    "UUID",
    "AgentStep",
    "GameStep",
    "Item",
    "Message",
    "Observation",
    "number",
]

Item = Any
"""One unit of work an environment hands out (a dataset row, a prompt, a game seed...)."""

number = int | float
"""A score or other numeric value that may be integral or not."""

UUID = str
"""An identifier in its string form."""


class Message(TypedDict):
    """One chat message, as chat templates and OpenAI-style APIs take it."""

    role: str
    content: str
    reward: NotRequired[float | None]


class Observation(TypedDict, total=False):
    """What an agent perceives at one step: text, an image, or both."""

    text: str
    image: Any
    """An image as the environment supplies it (e.g. a base64 string, bytes or a PIL image)."""
    metadata: dict[str, Any]


class GameStep(TypedDict, total=False):
    """One transition of a game environment."""

    observation: Observation
    action: str
    reward: float
    done: bool
    info: dict[str, Any]


class AgentStep(TypedDict, total=False):
    """One step of an agent: the conversation so far, the action it took and its outcome."""

    messages: list[Message]
    action: str
    reward: float
    done: bool
    info: dict[str, Any]
