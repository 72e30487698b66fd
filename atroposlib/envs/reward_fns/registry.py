"""Reward functions by name: a registry with decorator registration and lazy loading.

Only `combined` is registered when the package is imported; every other built-in lives in
its own module in this folder and is imported the first time its name is asked for
("accuracy" or "accuracy_reward" loads `accuracy_reward.py`), so a config that never
names `cosine_scaled` never pays for torch. A module is resolved to the class whose
registration name matches the requested one; failing that, the first RewardFunction
subclass it defines, and failing that a plain function, which is wrapped in
`LegacyFunctionWrapper` when created.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .reward_function import RewardFunction

logger = logging.getLogger(__name__)

_NAME_PATTERN = re.compile(r"[A-Za-z0-9_]+")
# Modules of this package that hold machinery, not reward functions.
_NOT_REWARD_MODULES = {"__init__", "registry", "reward_function"}


def default_registration_name(cls: type) -> str:
    """Upstream's rule: the lower-cased class name without a trailing "reward"."""
    name = cls.__name__.lower()
    return name[: -len("reward")] if name.endswith("reward") else name


class RewardRegistry:
    """Maps names to RewardFunction classes (or legacy functions) and builds instances."""

    def __init__(self) -> None:
        self._registry: dict[str, type[RewardFunction] | Callable] = {}
        self._reward_fns_dir = Path(__file__).parent

    def register(self, cls: type | None = None, name: str | None = None) -> Any:
        """Register a RewardFunction subclass; usable as `@register` or `@register(name=...)`.

        The registration name is the lower-cased class name without a trailing "reward"
        (`MyScoreReward` -> "myscore"). An explicit `name` is registered as given and, when
        it ends in "reward", also the way upstream registers it ("my_reward" -> "my_").
        """

        def _register(target: Any) -> Any:
            if not (inspect.isclass(target) and issubclass(target, RewardFunction)):
                raise TypeError(f"{target!r} is not a subclass of RewardFunction")
            if name:
                names = {name, name[:-6].lower() if name.endswith("reward") else name}
            else:
                names = {default_registration_name(target)}
            for registered in names:
                self._registry[registered] = target
                logger.debug("registered reward function %s", registered)
            return target

        return _register if cls is None else _register(cls)

    def register_function(self, name: str, function: Callable | type[RewardFunction]) -> None:
        """Register a plain scoring function (or a class) under `name` as it is."""
        self._registry[name] = function

    def create(self, name_or_config: str | Mapping[str, Any], **kwargs: Any) -> RewardFunction:
        """Build a reward function from a name or a `{"type": name, ...}` config.

        With a config, its keys (and those of a nested "params" dict) override `kwargs`,
        and everything left is passed to the constructor.
        """
        if isinstance(name_or_config, str):
            reward_type, params = name_or_config, dict(kwargs)
        elif isinstance(name_or_config, Mapping):
            config = dict(name_or_config)
            if "type" not in config:
                raise ValueError(f"reward function config needs a 'type' key: {config!r}")
            reward_type = config.pop("type")
            config.update(config.pop("params", None) or {})
            params = {**kwargs, **config}
        else:
            raise TypeError(
                "a reward function is named by a string or a dict with a 'type' key, "
                f"not {type(name_or_config).__name__}"
            )
        target = self.get(reward_type)
        if isinstance(target, type):  # inspect.isclass, which mypy narrows less usefully
            return target(**params)
        return LegacyFunctionWrapper(target, **params)

    def get(self, name: str) -> type[RewardFunction] | Callable:
        """The class (or legacy function) registered under `name`, loading it if needed."""
        if name not in self._registry:
            self._load_reward_function(name)
        return self._registry[name]

    def list_registered(self) -> list[str]:
        """Every name registered so far (built-ins appear once loaded)."""
        return list(self._registry)

    def load_required_functions(self, config: Any) -> set[str]:
        """Load every reward function a config names; return the set of names."""
        required: set[str] = set()
        for dataset in getattr(config, "datasets", None) or []:
            for field in ("dataset_reward_funcs", "reward_funcs"):
                required.update(getattr(dataset, field, None) or [])
            for type_config in getattr(dataset, "types", None) or []:
                required.update(type_config.get("reward_funcs") or [])
        for field in ("reward_functions", "reward_funcs"):
            for item in getattr(config, field, None) or []:
                if isinstance(item, str):
                    required.add(item)
                elif isinstance(item, Mapping) and "type" in item:
                    required.add(item["type"])
        for name in required:
            self.get(name)
        return required

    def _load_reward_function(self, name: str) -> None:
        """Import the built-in module for `name` and register what it provides."""
        module_name = self._find_module(name)
        try:
            module = importlib.import_module(f"{__package__}.{module_name}")
        except Exception as exc:
            raise ImportError(f"Failed to load reward function {name!r}: {exc}") from exc
        target = _pick_reward(module, name)
        if target is None:
            raise ImportError(
                f"Failed to load reward function {name!r}: "
                f"{module_name}.py defines no RewardFunction subclass or reward function"
            )
        self.register_function(name, target)

    def _find_module(self, name: str) -> str:
        base = name[: -len("_reward")] if name.endswith("_reward") else name
        if _NAME_PATTERN.fullmatch(name):
            for stem in dict.fromkeys((base, f"{base}_reward", name)):
                if stem in _NOT_REWARD_MODULES or stem.startswith("_"):
                    continue
                if (self._reward_fns_dir / f"{stem}.py").is_file():
                    return stem
        raise ImportError(
            f"Unknown reward function {name!r}: it is not registered "
            f"(registered: {sorted(self._registry)}) and is not a built-in reward module "
            f"({base}.py or {base}_reward.py in atroposlib.envs.reward_fns). Register your "
            "class with @registry.register first."
        )


def _pick_reward(module: Any, name: str) -> type[RewardFunction] | Callable | None:
    base = name[: -len("_reward")] if name.endswith("_reward") else name
    classes = [
        obj
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if issubclass(obj, RewardFunction)
        and obj.__module__ == module.__name__
        and not inspect.isabstract(obj)
    ]
    wanted = base.replace("_", "").lower()
    for cls in classes:
        if default_registration_name(cls) == wanted:
            return cls
    if classes:
        return classes[0]
    for attribute in (base, f"{base}_reward", "format_reward"):
        function = getattr(module, attribute, None)
        if callable(function):
            return function
    return None


class LegacyFunctionWrapper(RewardFunction):
    """A plain `f(completions, **kwargs)` scoring function behind the RewardFunction API.

    Extra constructor settings are kept in `config`; they are not passed to the function.
    """

    def __init__(self, func: Callable, weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(weight=weight, **kwargs)
        self.func = func
        self._func_name = getattr(func, "__name__", type(func).__name__)

    @property
    def name(self) -> str:
        """The wrapped function's name."""
        return self._func_name

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        """Call the function; a single number is repeated for every completion."""
        result = self.func(completions, **kwargs)
        if not isinstance(result, list):
            result = [result] * len(completions)
        return result


registry = RewardRegistry()
