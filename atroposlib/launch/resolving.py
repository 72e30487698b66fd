"""Small resolvers of the plan: free ports, the policy's path, flags from values, and
the flags a trainer module declares (`LAUNCH_CONFIG`) with their defaults."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
from typing import Any

from pydantic import BaseModel, ValidationError

from atroposlib.launch.config import (
    DEFAULT_TRAINER,
    DEFAULT_TRAINER_FLAGS,
    ConfigError,
    describe_errors,
)
from atroposlib.trainer_contract import LAUNCH_CONFIG_ATTRIBUTE
from atroposlib.utils.ports import free_ports, port_in_use
from atroposlib.utils.sections import leaf_fields


def pick_port(value: int | str, what: str, taken: set[int], count: int = 1) -> int:
    """A free port, or `count` consecutive free ones (the first is returned)."""

    def free(first: int) -> bool:
        ports = range(first, first + count)
        return first + count <= 65536 and not any(p in taken or port_in_use(p) for p in ports)

    if value == "auto":
        port = free_ports(count)
        while not free(port):
            port = free_ports(count)
    else:
        port = int(value)
        if not free(port):
            span = f"{port}-{port + count - 1}" if count > 1 else str(port)
            raise ConfigError(f"port {span} ({what}) is already in use")
    taken.update(range(port, port + count))
    return port


def flags(values: dict[str, Any], prefix: str = "--", dashes: bool = True) -> list[str]:
    """{'batch_size': 8} -> ['--batch-size', '8']; booleans as true/false. A value that
    starts with a dash is joined to its flag (`--engine-args=--enforce-eager`): argparse
    would read it as the next flag. A null (YAML's, or `--set KEY=null`) leaves the flag
    out, so the process keeps its own default (the string "None" would be a value)."""
    out = []
    for key, value in values.items():
        if value is None:
            continue
        name = key.replace("_", "-") if dashes else key
        if isinstance(value, bool):
            value = "true" if value else "false"
        text = str(value)
        out += [f"{prefix}{name}={text}"] if text.startswith("-") else [f"{prefix}{name}", text]
    return out


def resolve_model(model: str) -> str:
    """A named tiny model (`tiny`, `tiny-teacher`, `tiny-vl`: built if missing); anything
    else is as given."""
    from atroposlib.utils.tiny_model import NAMED_TINY_MODELS, TINY_VLM_NAME

    if model == TINY_VLM_NAME:
        from atroposlib.utils.tiny_vlm import TinyVlmSpec, ensure_tiny_vlm

        vlm = TinyVlmSpec()
        announce_build(model, vlm.cache_key(), "about two minutes")
        return str(ensure_tiny_vlm(vlm))
    spec = NAMED_TINY_MODELS.get(model)
    if spec is not None:
        from atroposlib.utils.tiny_model import ensure_tiny_model

        announce_build(model, spec.cache_key(), "about a minute")
        return str(ensure_tiny_model(spec))
    return model


def announce_build(model: str, cache_key: str, takes: str) -> None:
    """One line before a tiny model's first build, which the launch waits for."""
    from atroposlib.utils.tiny_model import default_cache_dir

    target = default_cache_dir() / cache_key
    if not (target / "config.json").exists():
        print(f"[launch] building the {model} model once into {target} ({takes})", flush=True)


def declared_config(module: str) -> type[BaseModel] | None:
    """The trainer's `LAUNCH_CONFIG` (a pydantic model of its flags), if it declares one."""
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ConfigError(f"trainer module not found: {module}")
    declaring = DEFAULT_TRAINER_FLAGS if module == DEFAULT_TRAINER else module
    try:
        loaded = importlib.import_module(declaring)
    except Exception as exc:
        raise ConfigError(f"trainer module {module} fails to import: {exc!r}") from exc
    declared = getattr(loaded, LAUNCH_CONFIG_ATTRIBUTE, None)
    if declared is not None and not (
        isinstance(declared, type) and issubclass(declared, BaseModel)
    ):
        raise ConfigError(f"{module}.{LAUNCH_CONFIG_ATTRIBUTE} is not a pydantic model class")
    return declared


def declared_default(declared: type[BaseModel] | None, name: str, module: str) -> Any:
    """`name`'s default in the trainer's declared flags, or why it must be given."""
    leaf = leaf_fields(declared).get(name) if declared is not None else None
    field_info = leaf.field if leaf is not None else None
    if field_info is None or field_info.is_required():
        raise ConfigError(
            f"trainer.args.{name} is required: trainer {module} declares no default for it"
        )
    return field_info.default


def validated(where: str, values: dict[str, Any], model: type[BaseModel]) -> BaseModel:
    """`values` (flat) as `model`, or a one-line refusal naming the key under `where`."""
    known = list(leaf_fields(model))
    unknown = sorted(set(values) - set(known))
    if unknown:
        said = []
        for key in unknown:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {where}.{close[0]}?" if close else ""
            said.append(f"unknown key '{where}.{key}' (not a {model.__name__} field){hint}")
        raise ConfigError("; ".join(said))
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {describe_errors(exc)}") from exc
