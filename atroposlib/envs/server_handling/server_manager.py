"""`ServerManager`: one front for several inference servers.

- Where servers come from (LIBRARY.md): a list of `APIServerConfig` (one client
  each), a single `APIServerConfig` (exactly that server; Atropos ignored its
  base_url), a `ServerBaseline` (local servers on ports 9004-9007), SLURM
  discovery, or `testing=True` (a canned harness, no network).
- Routing: each request goes to the healthy server with the most free slots of
  the request's split ("train" or "eval"), so a slow server gets less work.
- `n` above `max_n_completions` is split into several requests whose choices
  are merged in order.
- A server that cannot be reached is taken out of rotation and the request
  goes to another; when none is reachable the manager waits (with back-off, up
  to `unavailable_timeout_s`). A background probe of /health brings a server
  back when it answers again. Other errors are retried by the server client.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from pydantic import BaseModel, Field

from atroposlib.envs.server_handling.managed_server import ManagedServer
from atroposlib.envs.server_handling.openai_server import OpenAIServer
from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    ReasoningConfig,
    ServerBaseline,
    is_unreachable,
    merge_choices,
)
from atroposlib.envs.server_handling.vllm_server import VLLMServer

logger = logging.getLogger("atroposlib.inference")

DEFAULT_LOCAL_PORTS = range(9004, 9008)

__all__ = ["APIServerConfig", "ServerBaseline", "ServerManager", "ServerManagerConfig"]


class ServerManagerConfig(BaseModel):
    slurm: bool = Field(False, description="Discover inference servers from the SLURM job.")
    testing: bool = Field(False, description="Use a canned local harness (no network).")
    max_n_completions: int = Field(8, ge=1, description="Split larger n across requests.")


def _hostnames(nodelist: str) -> list[str]:
    result = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True
    )
    return result.stdout.split()


def slurm_server_configs(
    template: ServerBaseline,
    environ: dict[str, str] | None = None,
    hostnames: Callable[[str], list[str]] = _hostnames,
) -> list[APIServerConfig] | None:
    """Inference servers of a SLURM job, or None to fall back to the other cases.

    The first NUM_TRAINING_NODES nodes train; every other node serves on ports
    9000 .. 9000 + 8 // INFER_TP - 1.
    """
    environ = os.environ if environ is None else environ
    nodelist = environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        return None
    nodes = hostnames(nodelist)
    if len(nodes) < 2:
        return None
    training = int(environ.get("NUM_TRAINING_NODES", "1"))
    per_node = 8 // int(environ.get("INFER_TP", "1"))
    base = template.model_dump()
    return [
        APIServerConfig(**{**base, "base_url": f"http://{node}:{port}/v1"})
        for node in nodes[training:]
        for port in range(9000, 9000 + per_node)
    ]


def resolve_server_configs(
    configs: ServerBaseline | APIServerConfig | list[APIServerConfig], slurm: bool = False
) -> list[APIServerConfig]:
    if isinstance(configs, list):
        if not configs:
            raise ValueError("no inference servers configured")
        if slurm:
            return slurm_server_configs(configs[0]) or list(configs)
        return list(configs)
    if isinstance(configs, APIServerConfig):
        if slurm:
            return slurm_server_configs(configs) or [configs]
        return [configs]
    if slurm or os.environ.get("SLURM_JOB_NODELIST"):
        found = slurm_server_configs(configs)
        if found:
            return found
    base = configs.model_dump()
    return [
        APIServerConfig(**{**base, "base_url": f"http://localhost:{port}/v1", "api_key": "x"})
        for port in DEFAULT_LOCAL_PORTS
    ]


def server_for(config: APIServerConfig, reasoning: ReasoningConfig | None = None) -> APIServer:
    cls = VLLMServer if config.server_type == "vllm" else OpenAIServer
    return cls(config, reasoning)


class ServerManager:
    def __init__(
        self,
        configs: ServerBaseline | APIServerConfig | list[APIServerConfig],
        server_class: type[APIServer] | None = None,
        slurm: bool = False,
        testing: bool = False,
        max_n_completions: int = 8,
        reasoning_config: ReasoningConfig | None = None,
        health_interval_s: float = 2.0,
        unavailable_timeout_s: float = 300.0,
    ) -> None:
        self.max_n_completions = max_n_completions
        self.health_interval_s = health_interval_s
        self.unavailable_timeout_s = unavailable_timeout_s
        if testing:
            from atroposlib.envs.server_handling.testing_server import TestingServer

            self.servers: list[APIServer] = [TestingServer(APIServerConfig(model_name="testing"))]
        else:
            resolved = resolve_server_configs(configs, slurm)
            self.servers = [
                server_class(c, reasoning_config)
                if server_class
                else server_for(c, reasoning_config)
                for c in resolved
            ]
        self._probe_task: asyncio.Task | None = None

    # -- routing ------------------------------------------------------------
    def _pick(self, split: str = "train") -> APIServer:
        self._ensure_probe()
        healthy = [s for s in self.servers if s.server_healthy] or self.servers
        return max(healthy, key=lambda s: s.free_slots(split))

    def _ensure_probe(self) -> None:
        if self._probe_task is None or self._probe_task.done():
            try:
                self._probe_task = asyncio.get_running_loop().create_task(self._probe_forever())
            except RuntimeError:
                pass

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            down = [s for s in self.servers if not s.server_healthy and s.config.health_check]
            await asyncio.gather(*(s.probe() for s in down), return_exceptions=True)

    async def _dispatch(self, method: str, kwargs: dict[str, Any]) -> Any:
        """Call the best server; if it cannot be reached, fail over, or wait for one to return."""
        split = kwargs.get("split", "train")
        deadline = asyncio.get_running_loop().time() + self.unavailable_timeout_s
        delay = 0.2
        while True:
            server = self._pick(split)
            try:
                return await getattr(server, method)(**dict(kwargs))
            except Exception as exc:
                if not is_unreachable(exc):
                    raise
                logger.debug("inference server %s unreachable: %s", server.config.base_url, exc)
                if any(s.server_healthy for s in self.servers):
                    continue
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                await asyncio.gather(*(s.probe() for s in self.servers), return_exceptions=True)

    async def _split_n(self, method: str, kwargs: dict[str, Any]) -> Any:
        n = kwargs.get("n", 1) or 1
        if n <= self.max_n_completions:
            return await self._dispatch(method, kwargs)
        sizes = [self.max_n_completions] * (n // self.max_n_completions)
        if n % self.max_n_completions:
            sizes.append(n % self.max_n_completions)
        return list(
            await asyncio.gather(*(self._dispatch(method, {**kwargs, "n": k}) for k in sizes))
        )

    async def chat_completion(self, **kwargs: Any) -> Any:
        return merge_choices(await self._split_n("chat_completion", kwargs))

    async def completion(self, **kwargs: Any) -> Any:
        return merge_choices(await self._split_n("completion", kwargs))

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> Any:
        answers = await self._split_n("tokens_and_logprobs_completion", kwargs)
        if isinstance(answers, tuple):
            return answers
        prompt = answers[0][0]
        return (
            prompt,
            [o for a in answers for o in a[1]],
            [lp for a in answers for lp in a[2]],
            [f for a in answers for f in a[3]],
        )

    @asynccontextmanager
    async def managed_server(self, tokenizer: Any = None) -> AsyncIterator[ManagedServer]:
        """A `ManagedServer` over this manager (token-level calls keep the routing)."""
        if tokenizer is None:
            raise ValueError("managed_server needs the tokenizer that renders prompts")
        yield ManagedServer(self, tokenizer)

    @asynccontextmanager
    async def dedicated_server(self, split: str = "train") -> AsyncIterator[APIServer]:
        """One server for a multi-call interaction (e.g. to reuse its prefix cache)."""
        yield self._pick(split)

    @property
    def config(self) -> APIServerConfig:
        return self.servers[0].config

    async def wandb_metrics(self, metrics_dict: dict | None = None) -> dict:
        metrics_dict = metrics_dict if metrics_dict is not None else {}
        for index, server in enumerate(self.servers):
            await server.wandb_metrics(metrics_dict, f"server_{index}")
        return metrics_dict
