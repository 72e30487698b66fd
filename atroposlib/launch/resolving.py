"""Small resolvers of the plan: free ports, the policy's path, and flags from values."""

from __future__ import annotations

from typing import Any

from atroposlib.launch.config import ConfigError
from atroposlib.utils.ports import free_ports, port_in_use

TINY_MODEL = "tiny"


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
    """{'batch_size': 8} -> ['--batch-size', '8']; booleans as true/false."""
    out = []
    for key, value in values.items():
        name = key.replace("_", "-") if dashes else key
        if isinstance(value, bool):
            value = "true" if value else "false"
        out += [f"{prefix}{name}", str(value)]
    return out


def resolve_model(model: str) -> str:
    """'tiny' is the locally built tiny model (built if missing); anything else is as given."""
    if model == TINY_MODEL:
        from atroposlib.utils.tiny_model import TinyModelSpec, default_cache_dir, ensure_tiny_model

        target = default_cache_dir() / TinyModelSpec().cache_key()
        if not (target / "config.json").exists():
            print(
                f"[launch] building the tiny model once into {target} (about a minute)", flush=True
            )
        return str(ensure_tiny_model())
    return model
