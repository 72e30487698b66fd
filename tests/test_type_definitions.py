"""`atroposlib.type_definitions`: the names and shapes Atropos environments import."""

from __future__ import annotations

import typing

import atroposlib.type_definitions as types
from atroposlib.type_definitions import (
    UUID,
    AgentStep,
    GameStep,
    Item,
    Message,
    Observation,
    number,
)


def test_every_exported_name_exists():
    assert sorted(types.__all__) == [
        "AgentStep",
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


def test_message_requires_role_and_content_and_may_carry_a_reward():
    assert Message.__required_keys__ == {"role", "content"}
    assert Message.__optional_keys__ == {"reward"}


def test_step_shapes_have_only_optional_keys():
    assert Observation.__required_keys__ == frozenset()
    assert Observation.__optional_keys__ == {"text", "image", "metadata"}
    assert GameStep.__required_keys__ == frozenset()
    assert GameStep.__optional_keys__ == {"observation", "action", "reward", "done", "info"}
    assert AgentStep.__required_keys__ == frozenset()
    assert AgentStep.__optional_keys__ == {"messages", "action", "reward", "done", "info"}


def test_nested_shapes_point_at_each_other():
    hints = typing.get_type_hints(AgentStep)
    assert hints["messages"] == list[Message]
    assert typing.get_type_hints(GameStep)["observation"] is Observation
