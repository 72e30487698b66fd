"""Configs of nested sections that are read, and become flags, flat.

Design: a trainer's seventy settings read better in sections (`config.optim.lr`; a
loss takes `config.loss`, weight sync `config.weight_sync`), as prime-rl's nested
configs do, but its users type `--lr`, and upstream's flags and launch YAMLs are flat.
So a `SectionedConfig` takes flat keys (`lr=...`, `--lr`) and routes each to the
section that declares it; a leaf's name is unique across the sections (`leaf_fields`
checks). Another spelling of a leaf (upstream's) is its
`validation_alias=AliasChoices(name, other)`, declared once: the flags
(`utils.flags`), the launcher's key check and the compatibility table read it there.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, model_validator
from pydantic.fields import FieldInfo


@dataclass(frozen=True)
class Leaf:
    """A flat setting: its section (None at the top), its field name and its field."""

    section: str | None
    name: str
    field: FieldInfo


def aliases(name: str, field: FieldInfo) -> list[str]:
    """The field's other spellings (its `AliasChoices` beside its own name)."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [choice for choice in alias.choices if isinstance(choice, str) and choice != name]
    if isinstance(alias, str) and alias != name:
        return [alias]
    return []


def section_models(model: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """A sectioned config's sections by name (none for any other model)."""
    if not (isinstance(model, type) and issubclass(model, SectionedConfig)):
        return {}
    return {
        name: field.annotation
        for name, field in model.model_fields.items()
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
    }


@functools.cache
def leaf_fields(model: type[BaseModel]) -> dict[str, Leaf]:
    """Every flat name a model takes, its other spellings included, and what it sets."""
    sections = section_models(model)
    leaves: dict[str, Leaf] = {}

    def add(spelling: str, leaf: Leaf) -> None:
        taken = leaves.get(spelling)
        if taken is not None and taken != leaf:
            raise TypeError(
                f"{model.__name__}: {spelling!r} is in both {taken.section} and {leaf.section}"
            )
        leaves[spelling] = leaf

    for name, field in model.model_fields.items():
        owner = sections.get(name)
        inner = owner.model_fields.items() if owner is not None else [(name, field)]
        for leaf_name, leaf_field in inner:
            leaf = Leaf(name if owner is not None else None, leaf_name, leaf_field)
            for spelling in [leaf_name, *aliases(leaf_name, leaf_field)]:
                add(spelling, leaf)
    return leaves


def iter_leaves(model: type[BaseModel]) -> Iterator[Leaf]:
    """Each leaf once, in declaration order."""
    seen: set[tuple[str | None, str]] = set()
    for leaf in leaf_fields(model).values():
        if (leaf.section, leaf.name) not in seen:
            seen.add((leaf.section, leaf.name))
            yield leaf


class Section(BaseModel):
    """One section: its leaves are set by their names or their aliases; an unknown key
    is refused rather than dropped, and two spellings of one setting must agree."""

    model_config = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True)

    @model_validator(mode="before")
    @classmethod
    def _spellings_agree(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        for name, field in cls.model_fields.items():
            given = {s: data[s] for s in [name, *aliases(name, field)] if s in data}
            if len({str(value) for value in given.values()}) > 1:
                named = " and ".join("--" + s.replace("_", "-") for s in given)
                raise ValueError(f"{named} disagree: they are one setting; give one")
            for spelling in list(given)[1:]:  # one value: the others would be unknown keys
                del data[spelling]
        return data


class SectionedConfig(BaseModel):
    """A config of `Section`s that takes its leaves flat (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _route_flat_keys(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        leaves = leaf_fields(cls)
        routed: dict[str, Any] = {name: {} for name in section_models(cls)}
        for key, value in data.items():
            leaf = leaves.get(key)
            if leaf is not None and leaf.section is not None:
                routed[leaf.section][key] = value
            elif key in routed and isinstance(value, BaseModel):  # a section given whole
                routed[key].update(value.model_dump(exclude_unset=True))
            elif key in routed and isinstance(value, Mapping):
                routed[key].update(value)
            else:  # a top-level field, or unknown (which `extra="forbid"` refuses)
                routed[key] = value
        return routed

    def flat(self, name: str) -> Any:
        """The value of the leaf `name` (or one of its spellings), as a flat config had it."""
        leaf = leaf_fields(type(self)).get(name)
        if leaf is None:
            raise AttributeError(f"{type(self).__name__} has no setting {name!r}")
        holder = self if leaf.section is None else getattr(self, leaf.section)
        return getattr(holder, leaf.name)
