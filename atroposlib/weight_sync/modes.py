"""The weight bridge modes, apart from the bridges, so a config names them without torch."""

from __future__ import annotations

from typing import Literal

WeightBridgeMode = Literal[
    "none", "restart", "hot_reload", "lora_only", "lora_restart", "shared_vllm"
]
"""How new weights reach the engine (docs/trainer.md, Weight sync)."""
RESTART_MODES = ("none", "restart", "lora_restart")
"""The modes that restart the engine on a checkpoint; the others push into it."""
LORA_MODES = ("lora_only", "lora_restart")
