"""The inference engines, as registered kinds (verl's rollout registry).

`ENGINES` names each kind's class by import path, so checking a config's engine name
costs no import; `engine_kind(name)` loads it. A new engine is one module (an
`EngineKind` subclass) plus one line here; `register_engine` adds one at run time,
from outside the library. `transformers` is the CPU engine's earlier name.
`docs/inference.md`, "Adding an engine", walks through it.
"""

from __future__ import annotations

import importlib
from typing import Annotated

from pydantic import AfterValidator

from atroposlib.inference.engines.base import EngineKind

ENGINES: dict[str, str | EngineKind] = {
    "cpu": "atroposlib.inference.engines.cpu:CpuEngine",
    "vllm": "atroposlib.inference.engines.vllm:VllmEngine",
}
ALIASES = {"transformers": "cpu"}
AUTO = "auto"
"""Not a kind: pick vLLM where it can run, else the CPU engine (`resolve_kind`)."""


def register_engine(kind: EngineKind) -> EngineKind:
    """Add `kind` under its name (a name is taken once)."""
    if kind.name in ENGINES or kind.name in ALIASES or kind.name == AUTO:
        taken = ENGINES.get(kind.name)
        if not (isinstance(taken, EngineKind) and type(taken) is type(kind)):
            raise ValueError(f"an engine named {kind.name!r} is already registered")
    ENGINES[kind.name] = kind
    return kind


def canonical_name(name: str) -> str:
    """The registered name of `name` (an alias resolved), or an error naming them all."""
    name = ALIASES.get(name, name)
    if name not in ENGINES:
        known = ", ".join([*sorted(ENGINES), *sorted(ALIASES)])
        raise ValueError(f"no engine named {name!r}; registered: {known}")
    return name


def engine_kind(name: str) -> EngineKind:
    """The kind registered as `name` (or an alias of it)."""
    name = canonical_name(name)
    entry = ENGINES[name]
    if isinstance(entry, str):
        module, attribute = entry.split(":")
        entry = ENGINES[name] = getattr(importlib.import_module(module), attribute)()
    return entry


def resolve_kind(name: str, python: str) -> EngineKind:
    """`auto`: vLLM where `python` can run it on a GPU, else the CPU engine."""
    if name != AUTO:
        return engine_kind(name)
    vllm = engine_kind("vllm")
    return vllm if vllm.available(python) else engine_kind("cpu")


def engine_name(name: str) -> str:
    """`auto`, or the registered name of `name`; an error naming them all otherwise."""
    return name if name == AUTO else canonical_name(name)


EngineName = Annotated[str, AfterValidator(engine_name)]
"""A config's engine: `auto` or a registered kind (an alias becomes its kind's name)."""

__all__ = ["ENGINES", "EngineKind", "EngineName", "engine_kind", "engine_name", "register_engine"]
