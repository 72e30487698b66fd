"""How one kind of engine takes new weights while it runs: the seam between the
bridges (`bridge.py`, which decide what to export and when) and the engines.

Each engine kind that can take weights without a restart names its route
(`atroposlib.inference.engines`); the routes live beside the receivers they talk to:
`disk_reload.DiskReloadRoute` (this project's CPU engine) and `vllm.VllmRoute`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

HotMode = Literal["hot_reload", "lora_only"]


@dataclass(frozen=True)
class Push:
    """One export to load: where it is, its version label, and how to reach the engine."""

    path: Path
    version: str
    sync_key: str
    timeout_s: float
    served: str
    """The name the policy is served under (an adapter takes it)."""
    adapter: bool
    """`path` holds a LoRA adapter alone, not whole weights."""


class EngineRoute(Protocol):
    takes_adapters: bool
    """It serves LoRA adapters loaded at run time: `lora_only` pushes the adapter alone
    (else the merged weights)."""
    shares_memory: bool
    """It can read the trainer's weights from GPU memory (`shared_vllm`)."""

    def launch_extras(
        self, mode: HotMode, sync_key: str, lora_rank: int
    ) -> tuple[list[str], dict[str, str]]:
        """Flags and environment the engine must start with for `mode`'s pushes."""
        ...

    def served_name(self, name: str, adapter: bool) -> str:
        """What the engine serves its base model as, when adapters take `name`."""
        ...

    def push(self, url: str, push: Push) -> float:
        """Load `push` into the engine at `url`; seconds spent. Raises `WeightSyncError`
        when the engine did not take it."""
        ...
