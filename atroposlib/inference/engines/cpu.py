"""This project's CPU engine, `atropos-inference-server` (transformers on torch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from atroposlib.inference.engines.base import EngineKind

if TYPE_CHECKING:
    from atroposlib.weight_sync.route import EngineRoute


class CpuEngine(EngineKind):
    name = "cpu"
    module = "atroposlib.cli.inference_server"

    def placement(self, device: str) -> tuple[list[str], dict[str, str]]:
        return ([], {}) if device == "auto" else (["--device", device], {})

    def thread_flags(self, threads: int) -> list[str]:
        return ["--num-threads", str(threads)]

    def weight_route(self) -> EngineRoute | None:
        from atroposlib.weight_sync.disk_reload import DiskReloadRoute

        return DiskReloadRoute()
