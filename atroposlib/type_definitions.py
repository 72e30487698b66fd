"""Shared type names that environment code imports.

Environments written for Atropos import names such as ``Message``, ``Item`` or
``number`` from ``atroposlib.type_definitions``. They are defined here so that
those environments import unchanged. They are plain typing aliases and
``TypedDict`` shapes: they document what flows between an environment, the
inference server and the trainer, and cost nothing at runtime.
"""

from typing import Any, NotRequired, TypedDict

from openai.types.chat import ChatCompletionContentPartParam

__all__ = [
    "UUID",
    "AgentHistory",
    "AgentStep",
    "Content",
    "EvaluationConfigGeneral",
    "EvaluationMetrics",
    "EvaluationResults",
    "EvaluationSample",
    "GameHistory",
    "GameStep",
    "Item",
    "Message",
    "Observation",
    "number",
]

Content = str | list[ChatCompletionContentPartParam]
"""A message's content: plain text, or OpenAI content parts (text and images)."""

Item = Any
"""One unit of work an environment hands out (a dataset row, a prompt, a game seed...)."""

number = int | float
"""A score or other numeric value that may be integral or not."""

UUID = str
"""An identifier in its string form."""


class Message(TypedDict):
    """One chat message, as chat templates and OpenAI-style APIs take it.

    Roles are not restricted: game environments also use "agent" and "environment".
    """

    role: str
    content: Content
    reward: NotRequired[float | None]


class AgentStep(TypedDict, total=False):
    """One step of one agent: its number, the messages exchanged and the reward it got."""

    step: int
    messages: list[Message]
    reward: float


AgentHistory = dict[str, list[AgentStep]]
"""Each agent's steps, by agent id (e.g. "Player 1")."""


class Observation(TypedDict):
    """What an agent perceives at one step: the raw state, and its rendering for an LLM."""

    raw: dict[str, Any]
    rendered: Content


class GameStep(TypedDict):
    """One (state, action, reward) transition of a game, with its metadata.

    ``reward`` is one number, or one per agent name; ``done`` marks the end of the game.
    """

    step: int
    agent_id: str
    observation: Observation
    action: str
    reward: float | dict[str, float]
    done: bool
    info: dict[str, Any]


GameHistory = list[GameStep]
"""A game as the list of its steps."""


class EvaluationConfigGeneral(TypedDict):
    """The ``config_general`` section of an evaluation's metrics file."""

    total_evaluation_time_seconds: str
    model_name: str | None
    generation_parameters: dict[str, Any]


class EvaluationResults(TypedDict):
    """The ``results`` section of an evaluation's metrics file; ``all`` aggregates every task."""

    all: dict[str, float]


class EvaluationMetrics(TypedDict):
    """An evaluation's metrics file (``metrics.json``) as a whole."""

    config_general: EvaluationConfigGeneral
    results: EvaluationResults


class EvaluationSample(TypedDict, total=False):
    """One evaluated sample, a line of the samples jsonl; every field is optional."""

    messages: list[dict[str, str]] | None
    question: str | None
    gold_answer: str | None
    gold_parsed: str | None
    model_parsed: str | None
    score: int | None
    correct: bool | None
    finish_reason: str | None
    response_after_think: str | None
