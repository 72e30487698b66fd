"""A reward named by one string, for an environment's `reward:` and `atropos-rollouts rescore`.

The one grammar (docs/rollouts.md):
- `accuracy`, `format`, ...: a registered reward (reward_fns/registry.py);
- `module:function` or `path/to/file.py:function`: a plain function, TRL's way:
  `function(completions, prompts=..., **item_fields) -> list[float]`, where each
  keyword is a list with one value per completion (the item's fields are its columns);
- `path/to/env.py` or `path/to/env.py:EnvClass`: an environment's own `score_sample`
  (a `SingleTurnEnv`), from the file as it is now (a fixed scoring bug re-scores old
  groups).

Design: every sample is scored on its own, and an exception is the caller's to count:
unlike `RewardFunction.__call__`, which scores a failed batch 0.0 so that a broken
reward cannot stop a rollout, re-scoring must never turn a crash into a silent 0.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Messages = list[dict[str, Any]]


class RewardSpecError(ValueError):
    """A reward that cannot be loaded; one line."""


@dataclass(frozen=True)
class Reward:
    """A loaded reward: `score` one completion, or raise."""

    label: str
    score_one: Callable[[str, Messages, Any], float]

    def score(self, completion: str, prompt: Messages, item: Any) -> float:
        value = self.score_one(completion, prompt, item)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{self.label} returned {type(value).__name__}, not a number")
        return float(value)


@functools.lru_cache(maxsize=32)
def load_reward(spec: str) -> Reward:
    """The reward `spec` names (see the module docstring); loaded once per process (the
    config's check and the environment use the same one)."""
    spec = spec.strip()
    if not spec:
        raise RewardSpecError("an empty reward: name one, module:function, or an env file")
    where, colon, name = spec.rpartition(":") if ":" in spec else (spec, "", "")
    if not colon and not spec.endswith(".py"):
        return _registered(spec)
    module = _load_module(where)
    if not name:
        return _environment(spec, _env_class(module, spec))
    target = getattr(module, name, None)
    if target is None:
        raise RewardSpecError(f"reward {spec!r}: {where} has no {name!r}")
    if inspect.isclass(target):
        return _environment(spec, target)
    if not callable(target):
        raise RewardSpecError(f"reward {spec!r}: {name} is not a function")
    return Reward(spec, _plain(target))


def _registered(name: str) -> Reward:
    from atroposlib.envs.reward_fns.registry import registry

    try:
        reward = registry.create(name)
    except (ImportError, KeyError, ValueError) as error:
        raise RewardSpecError(
            f"reward {name!r} is not registered ({error}); name a registered reward, "
            "module:function, or an environment file (path/to/env.py)"
        ) from None

    def score_one(completion: str, prompt: Messages, item: Any) -> float:
        return reward.compute([completion], prompts=[prompt], **_columns(item))[0]

    return Reward(name, score_one)


def _plain(function: Callable[..., Any]) -> Callable[[str, Messages, Any], float]:
    def score_one(completion: str, prompt: Messages, item: Any) -> float:
        values = function(completions=[completion], prompts=[prompt], **_columns(item))
        if isinstance(values, list | tuple):
            if len(values) != 1:
                raise ValueError(f"returned {len(values)} scores for 1 completion")
            return values[0]
        return values

    return score_one


def _columns(item: Any) -> dict[str, list[Any]]:
    """The item's fields as one-row columns (TRL passes dataset columns this way)."""
    if isinstance(item, Mapping):
        return {str(key): [value] for key, value in item.items()}
    return {} if item is None else {"item": [item]}


def _load_module(where: str) -> Any:
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise RewardSpecError(f"reward file {where} does not exist")
        name = f"_atropos_reward_{abs(hash(path.resolve()))}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise RewardSpecError(f"cannot import {where}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        loader = spec.loader
    else:
        try:
            return importlib.import_module(where)
        except ImportError as error:
            raise RewardSpecError(f"cannot import module {where!r}: {error}") from None
    try:
        loader.exec_module(module)
    except Exception as error:  # the user's file: any error is its own line
        raise RewardSpecError(
            f"importing {where} failed: {type(error).__name__}: {error}"
        ) from None
    return module


def _env_class(module: Any, spec: str) -> type:
    from atroposlib.envs.single_turn import SingleTurnEnv

    found = [
        value
        for value in vars(module).values()
        if inspect.isclass(value)
        and issubclass(value, SingleTurnEnv)
        and value.__module__ == module.__name__
    ]
    if len(found) != 1:
        raise RewardSpecError(
            f"reward {spec!r}: the file defines {len(found)} SingleTurnEnv classes; name "
            "one as path/to/env.py:Class, or give module:function"
        )
    return found[0]


def _environment(spec: str, cls: type) -> Reward:
    """An environment's own scoring; built from its `config_init`, never set up or
    connected (scoring must not need either)."""
    from atroposlib.envs.single_turn import Sample, SingleTurnEnv

    if not issubclass(cls, SingleTurnEnv):
        raise RewardSpecError(f"reward {spec!r}: {cls.__name__} is not a SingleTurnEnv")
    try:
        config, servers = cls.config_init()
        env = cls(config, servers, testing=True)
    except Exception as error:  # the user's environment: any error is its own line
        raise RewardSpecError(
            f"reward {spec!r}: building {cls.__name__} failed: {type(error).__name__}: {error}"
        ) from None

    def score_one(completion: str, prompt: Messages, item: Any) -> float:
        value = env.score_sample(Sample(completion), item)
        if inspect.isawaitable(value):
            value = asyncio.run(_awaited(value))
        return value

    return Reward(spec, score_one)


async def _awaited(value: Any) -> Any:
    return await value
