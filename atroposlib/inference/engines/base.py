"""`EngineKind`: what the trainer and the launcher must know of one kind of engine.

A kind says how to start its server (the module run as `python -m`, the flags every
engine here takes, the kind's own ones), where it runs (`placement`), how new weights
reach it while it runs (`weight_route`, or None: it is restarted on them), and where
it answers health checks. The process itself is `launcher.EngineProcess`; the policy
of restarts and fallbacks over several processes is `fleet.EngineFleet`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from atroposlib.inference.launcher import EngineConfig
    from atroposlib.weight_sync.route import EngineRoute


class EngineKind:
    """One kind of engine; subclass it, then add one line to `engines.ENGINES`."""

    name: ClassVar[str]
    module: ClassVar[str]
    """The server, run as `python -m MODULE`: OpenAI's routes and `health_path`."""
    health_path: ClassVar[str] = "/health"

    def command(self, config: EngineConfig, model_path: str) -> list[str]:
        """The whole command line: the flags every engine here shares (vLLM's names),
        then the kind's own (`own_flags`), then the config's extra ones."""
        command = [
            config.python,
            "-m",
            self.module,
            "--model",
            str(model_path),
            "--host",
            config.host,
            "--port",
            str(config.port),
            "--served-model-name",
            config.served_model_name,
        ]
        if config.max_model_len:
            command += ["--max-model-len", str(config.max_model_len)]
        if config.dtype:
            command += ["--dtype", config.dtype]
        return command + self.own_flags(config) + list(config.extra_args)

    def own_flags(self, config: EngineConfig) -> list[str]:
        return []

    def placement(self, device: str) -> tuple[list[str], dict[str, str]]:
        """Flags and environment that put the engine on `device` (cpu, cuda, cuda:N)."""
        return [], {}

    def thread_flags(self, threads: int) -> list[str]:
        """Flags that give a CPU engine `threads` torch threads (none for a GPU engine)."""
        return []

    def launch_env(self) -> dict[str, str]:
        """Environment the server always needs (the caller's values win)."""
        return {}

    def weight_route(self) -> EngineRoute | None:
        """How the running engine takes new weights; None: it is restarted on them."""
        return None

    @property
    def supports_lora(self) -> bool:
        """It serves LoRA adapters loaded at run time."""
        route = self.weight_route()
        return route is not None and route.takes_adapters

    def available(self, python: str) -> bool:
        """Whether `--inference-engine auto` may pick it for `python`."""
        return True
