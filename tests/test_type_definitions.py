"""`atroposlib.type_definitions`: the names and shapes Atropos environments import."""

from __future__ import annotations

import json
import subprocess
import sys
import typing

import pytest
from openai.types.chat import ChatCompletionContentPartParam

import atroposlib.type_definitions as types
from atroposlib.type_definitions import (
    UUID,
    AgentHistory,
    AgentStep,
    Content,
    EvaluationConfigGeneral,
    EvaluationMetrics,
    EvaluationResults,
    EvaluationSample,
    GameHistory,
    GameStep,
    Item,
    Message,
    Observation,
    number,
)


def test_every_exported_name_exists():
    assert sorted(types.__all__) == [
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
        "UUID",
        "number",
    ]
    assert all(hasattr(types, name) for name in types.__all__)


def test_aliases():
    assert Item is typing.Any
    assert UUID is str
    assert isinstance(3, number) and isinstance(0.5, number)
    assert not isinstance("3", number)
    assert Content == str | list[ChatCompletionContentPartParam]
    assert GameHistory == list[GameStep]
    assert AgentHistory == dict[str, list[AgentStep]]


def test_message_requires_role_and_content_and_may_carry_a_reward():
    assert Message.__required_keys__ == {"role", "content"}
    assert Message.__optional_keys__ == {"reward"}
    assert typing.get_type_hints(Message)["content"] == Content


def test_game_shapes_are_upstreams():
    assert Observation.__required_keys__ == {"raw", "rendered"}
    assert GameStep.__required_keys__ == {
        "step",
        "agent_id",
        "observation",
        "action",
        "reward",
        "done",
        "info",
    }
    assert AgentStep.__required_keys__ == frozenset()
    assert AgentStep.__optional_keys__ == {"step", "messages", "reward"}


def test_nested_shapes_point_at_each_other():
    assert typing.get_type_hints(AgentStep)["messages"] == list[Message]
    hints = typing.get_type_hints(GameStep)
    assert hints["observation"] is Observation
    assert hints["reward"] == float | dict[str, float]
    assert typing.get_type_hints(Observation)["rendered"] == Content


def test_evaluation_shapes_describe_the_metrics_file():
    assert EvaluationConfigGeneral.__required_keys__ == {
        "total_evaluation_time_seconds",
        "model_name",
        "generation_parameters",
    }
    assert EvaluationResults.__required_keys__ == {"all"}
    hints = typing.get_type_hints(EvaluationMetrics)
    assert hints == {"config_general": EvaluationConfigGeneral, "results": EvaluationResults}
    assert EvaluationSample.__required_keys__ == frozenset()
    assert EvaluationSample.__optional_keys__ == {
        "messages",
        "question",
        "gold_answer",
        "gold_parsed",
        "model_parsed",
        "score",
        "correct",
        "finish_reason",
        "response_after_think",
    }


def test_shapes_build_plain_json_values():
    """As upstream's multimodal environments use them: plain dicts that serialise as JSON."""
    observation: Observation = {
        "raw": {"hand": [10, 9]},
        "rendered": [{"type": "text", "text": "You hold 19."}],
    }
    step: GameStep = {
        "step": 0,
        "agent_id": "Player 1",
        "observation": observation,
        "action": "stick",
        "reward": {"Player 1": 1.0},
        "done": True,
        "info": {},
    }
    history: GameHistory = [step]
    agents: AgentHistory = {"Player 1": [{"step": 0, "messages": [], "reward": 1.0}]}
    metrics: EvaluationMetrics = {
        "config_general": {
            "total_evaluation_time_seconds": "1.5",
            "model_name": None,
            "generation_parameters": {"temperature": 0.0},
        },
        "results": {"all": {"accuracy": 0.5}},
    }
    document = {"history": history, "agents": agents, "metrics": metrics}
    assert json.loads(json.dumps(document)) == document


@pytest.mark.integration
def test_upstream_import_lines_work_in_a_fresh_interpreter():
    code = (
        "from atroposlib.type_definitions import GameHistory, Item\n"
        "from atroposlib.type_definitions import Item, number\n"
        "from atroposlib.type_definitions import UUID, Message\n"
        "print(GameHistory)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert "GameStep" in result.stdout
