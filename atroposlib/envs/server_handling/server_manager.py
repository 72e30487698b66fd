"""`ServerManager`: one front for several inference servers.

- Where servers come from (LIBRARY.md): a list of `APIServerConfig` (one client
  each), a single `APIServerConfig` (exactly that server; Atropos ignored its
  base_url), a `ServerBaseline` (local servers on ports 9004-9007), SLURM
  discovery, or `testing=True` (a canned harness, no network).
- Routing: each request goes to the healthy server with the most free slots of
  the request's split ("train" or "eval"), so a slow server gets less work.
- `n` above `max_n_completions` is split into several requests whose choices
  are merged in order; with a `seed`, the part starting at sample k gets
  `seed + k`, so the parts do not repeat each other's samples.
- A server that cannot be reached is taken out of rotation and the request
  goes to another. When none is reachable (the trainer is restarting the
  engine from a new checkpoint, which can take minutes) requests wait for one
  to answer /health again: with no limit by default, like upstream, or up to
  `unavailable_timeout_s`. One WARNING when the wait starts, an INFO note
  every `wait_log_interval_s`, an INFO when requests resume. A background
  probe of /health brings a server back when it answers again. Other errors
  are retried by the server client. Servers with `health_check=False` are
  never waited for: like upstream, their errors are retried, then raised.
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
    offset_seed,
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
        health_interval_s: float = 1.0,
        unavailable_timeout_s: float | None = None,
        wait_log_interval_s: float = 30.0,
    ) -> None:
        """`health_interval_s`: seconds between /health probes of a server that is down
        (upstream polls every second). `unavailable_timeout_s`: how long requests wait
        when no server is reachable; None (the default, like upstream) waits until one
        is. `wait_log_interval_s`: seconds between the notes logged while waiting."""
        self.max_n_completions = max_n_completions
        self.health_interval_s = health_interval_s
        self.unavailable_timeout_s = unavailable_timeout_s
        self.wait_log_interval_s = wait_log_interval_s
        self._outage: asyncio.Task | None = None
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
        while True:
            server = self._pick(split)
            try:
                return await getattr(server, method)(**dict(kwargs))
            except Exception as exc:
                if not (is_unreachable(exc) and server.config.health_check):
                    raise
                logger.debug("inference server %s unreachable: %s", server.config.base_url, exc)
                if any(s.server_healthy for s in self.servers):
                    continue
                if not await self._wait_for_a_server():
                    raise

    async def _wait_for_a_server(self) -> bool:
        """Wait until some server answers /health: True, or False once the wait has lasted
        `unavailable_timeout_s`. Every waiting request shares one waiter, so an outage is
        logged once whatever the number of requests."""
        if self._outage is None or self._outage.done():
            self._outage = asyncio.get_running_loop().create_task(self._wait_out_outage())
        return await asyncio.shield(self._outage)

    async def _wait_out_outage(self) -> bool:
        loop = asyncio.get_running_loop()
        started = loop.time()
        checked = [s for s in self.servers if s.config.health_check]
        urls = ", ".join(s.config.base_url for s in checked)
        limit = (
            "no limit"
            if self.unavailable_timeout_s is None
            else f"up to {self.unavailable_timeout_s:g}s"
        )
        logger.warning(
            "no inference server reachable (%s); requests are waiting for one to come back "
            "(%s; an engine restart from a new checkpoint can take minutes)",
            urls,
            limit,
        )
        next_note = started + self.wait_log_interval_s
        delay = min(0.2, self.health_interval_s)
        while True:
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.health_interval_s)
            answers = await asyncio.gather(*(s.probe() for s in checked), return_exceptions=True)
            waited = loop.time() - started
            if any(answer is True for answer in answers):
                logger.info("inference server back after %.1fs; resuming requests", waited)
                return True
            if self.unavailable_timeout_s is not None and waited >= self.unavailable_timeout_s:
                logger.error(
                    "no inference server reachable for %.1fs (%s); giving up", waited, urls
                )
                return False
            if loop.time() >= next_note:
                logger.info("still waiting for an inference server (%s): %.0fs", urls, waited)
                next_note = loop.time() + self.wait_log_interval_s

    async def _split_n(self, method: str, kwargs: dict[str, Any]) -> Any:
        n = kwargs.get("n", 1) or 1
        if n <= self.max_n_completions:
            return await self._dispatch(method, kwargs)
        sizes = [self.max_n_completions] * (n // self.max_n_completions)
        if n % self.max_n_completions:
            sizes.append(n % self.max_n_completions)
        parts = [
            {**kwargs, "n": k, **offset_seed(kwargs, sum(sizes[:i]))} for i, k in enumerate(sizes)
        ]
        return list(await asyncio.gather(*(self._dispatch(method, part) for part in parts)))

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
        """A `ManagedServer` over this manager (token-level calls keep the routing).

        Without `tokenizer`, the servers' own is used (see `tokenizer`). Its recorded
        nodes are cleared on exit, as upstream does: read `get_state()` inside.
        """
        managed = ManagedServer(self, tokenizer if tokenizer is not None else self.tokenizer)
        try:
            yield managed
        finally:
            managed.reset()

    @property
    def tokenizer(self) -> Any:
        """The served model's tokenizer (the first server's: they serve one model)."""
        return self.servers[0].tokenizer

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
