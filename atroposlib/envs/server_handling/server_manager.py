"""`ServerManager`: one front for several inference servers.

- Where servers come from: see `server_discovery` (configs, SLURM, local
  ports), or `testing=True` (a `ServerHarness`: scriptable, canned by default,
  no network).
- Routing: each request goes to the healthy server with the most free slots of
  the request's split ("train", or anything else for evaluation) within the
  env's weight (`update_weight`), so a slow server gets less work.
- `n` above `max_n_completions` is split into several requests whose choices
  are merged in order; with a `seed`, the part starting at sample k gets
  `seed + k`, so the parts do not repeat each other's samples.
- A server that cannot be reached is taken out of rotation and the request
  goes to another. When none is reachable (the trainer is restarting the
  engine from a new checkpoint, which can take minutes) requests wait for one
  to answer /health again: with no limit by default, like upstream, or up to
  `unavailable_timeout_s`. One short WARNING when the wait starts (the URLs
  and the limit at DEBUG on `OUTAGE_LOGGER`), an INFO note every
  `wait_log_interval_s`, an INFO when requests resume. A background
  probe of /health brings a server back when it answers again. Other errors
  are retried by the server client. Servers with `health_check=False` are
  never waited for: like upstream, their errors are retried, then raised.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from pydantic import BaseModel, Field

from atroposlib.envs.server_handling.managed_server import ManagedServer
from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    ReasoningConfig,
    ServerBaseline,
    is_unreachable,
    merge_choices,
    offset_seed,
    outage_logger,
)
from atroposlib.envs.server_handling.server_discovery import (  # noqa: F401 - re-exported
    DEFAULT_LOCAL_PORTS,
    resolve_server_configs,
    server_for,
    slurm_server_configs,
)
from atroposlib.envs.server_handling.server_harness import ServerHarness

logger = logging.getLogger("atroposlib.inference")

PROXY_URL_ENV = "ATROPOS_PROXY_URL"
ALLOW_DUMMY_ENV = "ATROPOS_ALLOW_DUMMY_MANAGED_SERVER"

__all__ = ["APIServerConfig", "ServerBaseline", "ServerManager", "ServerManagerConfig"]


class ServerManagerConfig(BaseModel):
    slurm: bool = Field(False, description="Discover inference servers from the SLURM job.")
    testing: bool = Field(False, description="Use a scriptable local harness (no network).")
    max_n_completions: int = Field(8, ge=1, description="Split larger n across requests.")
    proxy_url: str | None = Field(
        None,
        description="URL of a ManagedServer OpenAI proxy (atropos-proxy): managed_server() "
        f"then opens a session there; also read from {PROXY_URL_ENV}.",
    )


def _slots(server: Any, split: str) -> float:
    """Free slots of `server` for `split`, for clients without `free_slots` too."""
    if hasattr(server, "free_slots"):
        return server.free_slots(split)
    sem = server.sem if split == "train" else server.eval_sem
    return sem._value - (sem.min_val() if hasattr(sem, "min_val") else 0)


class ServerManager:
    """The env's one front for its inference servers: routing, splitting, outages.

    Requests go to the healthy server with the most free slots; an `n` over
    `max_n_completions` is split and merged; an unreachable server leaves rotation until
    it answers again (see the module docstring).
    """

    # defaults for a manager made without __init__ (upstream's tests build one that way)
    max_n_completions = 8
    health_interval_s = 1.0
    unavailable_timeout_s: float | None = None
    wait_log_interval_s = 30.0
    reasoning_config: ReasoningConfig | None = None
    proxy_url: str | None = None
    use_proxy = False
    tool_parser: str | None = None
    _outage: asyncio.Task | None = None
    _probe_task: asyncio.Task | None = None

    def __init__(
        self,
        configs: ServerBaseline | APIServerConfig | list[APIServerConfig],
        server_class: type[APIServer] | None = None,
        slurm: bool = False,
        testing: bool = False,
        max_n_completions: int = 8,
        reasoning_config: ReasoningConfig | None = None,
        proxy_url: str | None = None,
        use_proxy: bool = False,
        tool_parser: str | None = None,
        health_interval_s: float = 1.0,
        unavailable_timeout_s: float | None = None,
        wait_log_interval_s: float = 30.0,
    ) -> None:
        """Upstream's arguments, plus: `health_interval_s`, seconds between /health probes
        of a server that is down (upstream polls every second); `unavailable_timeout_s`,
        how long requests wait when no server is reachable (None, the default like
        upstream, waits until one is); `wait_log_interval_s`, seconds between the notes
        logged while waiting. `server_class` None or abstract picks the client by each
        config's `server_type`. `tool_parser` is handed to `managed_server()`'s
        ManagedServer; with `proxy_url` (or ATROPOS_PROXY_URL) `managed_server()` opens a
        session on that ManagedServer proxy instead (`proxy_client.py`)."""
        self.max_n_completions = max_n_completions
        self.reasoning_config = reasoning_config
        self.proxy_url = proxy_url or os.environ.get(PROXY_URL_ENV)
        self.use_proxy = use_proxy or bool(self.proxy_url)
        self.tool_parser = tool_parser
        self.health_interval_s = health_interval_s
        self.unavailable_timeout_s = unavailable_timeout_s
        self.wait_log_interval_s = wait_log_interval_s
        if testing:
            self.servers: list[APIServer] = [ServerHarness()]
        else:
            resolved = resolve_server_configs(configs, slurm)
            self.servers = [server_for(c, reasoning_config, server_class) for c in resolved]

    # -- routing ------------------------------------------------------------
    def _pick(self, split: str = "train") -> APIServer:
        self._ensure_probe()
        healthy = [s for s in self.servers if s.server_healthy] or self.servers
        return max(healthy, key=lambda s: _slots(s, split))

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
        # base_url None (or ""): the OpenAI SDK's default, where its requests go
        urls = ", ".join(s.config.base_url or s.endpoint_url for s in checked)
        limit = (
            "no limit"
            if self.unavailable_timeout_s is None
            else f"up to {self.unavailable_timeout_s:g}s"
        )
        if any(s.request_timings or s.eval_request_timings for s in self.servers):
            logger.warning("waiting for an inference server")  # fits the launcher's console
        else:  # none has answered yet: an engine still starting (a run's first minute)
            logger.info("waiting for the inference server to start")
        outage_logger.debug(
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
                logger.info("still waiting for an inference server: %.0fs", waited)
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

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        """Prompt logprobs from the best server: `{"prompt_tokens", "prompt_topk_token_ids",
        "prompt_topk_logprobs"}` (see `APIServer.get_logprobs`)."""
        return await self._dispatch("get_logprobs", kwargs)

    async def update_weight(self, weight: float) -> None:
        """Let this env use only `weight` (0..1] of every server's concurrency limits."""
        for server in self.servers:
            await server.update_weight(weight)

    async def wait_for_sem(self, is_training: bool) -> None:
        """Wait until some server has a free slot for training (or evaluation) requests."""
        split = "train" if is_training else "eval"
        while all(_slots(server, split) <= 0 for server in self.servers):
            await asyncio.sleep(0.05)

    def _get_server_base_url(self, server_idx: int = 0) -> str | None:
        """The configured `base_url` of server `server_idx`, or None."""
        if not self.servers:
            return None
        return getattr(getattr(self.servers[server_idx], "config", None), "base_url", None)

    @asynccontextmanager
    async def managed_server(
        self,
        tokenizer: Any = None,
        base_url: str | None = None,
        preserve_think_blocks: bool = False,
        use_proxy: bool | None = None,
    ) -> AsyncIterator[Any]:
        """A `ManagedServer` for one rollout; its recorded nodes are cleared on exit, as
        upstream does (read `get_state()` inside).

        It works over this whole manager, so its requests keep the routing and failover;
        `base_url` pins it to that server. Without `tokenizer`, the servers' own is used.
        Over text-only OpenAI endpoints it raises NotImplementedError unless
        ATROPOS_ALLOW_DUMMY_MANAGED_SERVER=1, which gives a DummyManagedServer
        (placeholder tokens, never for training), as upstream.

        Through the proxy (`proxy_url` / ATROPOS_PROXY_URL at init, or `use_proxy=True`
        here) it yields a `ProxyManagedServer`: a session on the proxy whose `get_url()`
        an OpenAI-only agent can use; `await managed.fetch_state()` reads its nodes, and
        the session is deleted on exit, as upstream.
        """
        if self.use_proxy if use_proxy is None else use_proxy:
            async with self._proxy_session(base_url) as proxied:
                yield proxied
            return
        target: Any = self
        if base_url is not None:
            pinned = [s for s in self.servers if s.config.base_url == base_url]
            if not pinned:
                known = [s.config.base_url for s in self.servers]
                raise ValueError(f"no server with base_url {base_url!r}; servers: {known}")
            target = pinned[0]
        candidates = [target] if target is not self else self.servers
        if not any(getattr(s, "token_ids_supported", True) for s in candidates):
            managed = self._dummy_managed_server(candidates[0], tokenizer)
        else:
            managed = self._managed_server(target, tokenizer, preserve_think_blocks)
        try:
            yield managed
        finally:
            managed.reset()

    @asynccontextmanager
    async def _proxy_session(self, base_url: str | None) -> AsyncIterator[Any]:
        if not self.proxy_url:
            raise ValueError(
                f"use_proxy=True requires proxy_url or the {PROXY_URL_ENV} environment "
                "variable at ServerManager init"
            )
        from atroposlib.envs.server_handling.proxy_client import create_proxy_session

        model_name = self.servers[0].config.model_name if self.servers else "unknown"
        session = await create_proxy_session(
            self.proxy_url,
            base_url=base_url,
            tool_parser=self.tool_parser or "hermes",
            model_name=model_name,
        )
        try:
            yield session
        finally:
            await session.cleanup()

    def _managed_server(self, target: Any, tokenizer: Any, preserve_think_blocks: bool) -> Any:
        tokenizer = tokenizer if tokenizer is not None else target.tokenizer
        accepted = inspect.signature(ManagedServer).parameters
        options: dict[str, Any] = {
            "tool_parser": self.tool_parser,
            "preserve_think_blocks": preserve_think_blocks,
        }
        return ManagedServer(
            target, tokenizer, **{k: v for k, v in options.items() if k in accepted}
        )

    @staticmethod
    def _dummy_managed_server(server: APIServer, tokenizer: Any) -> Any:
        if os.environ.get(ALLOW_DUMMY_ENV, "").lower() not in ("1", "true", "yes"):
            raise NotImplementedError(
                "OpenAI endpoints do not support token IDs or logprobs required for "
                "ManagedServer (use server_type='vllm' or 'sglang'). If placeholder tokens "
                f"and logprobs are acceptable (evaluation or testing, never training), set "
                f"{ALLOW_DUMMY_ENV}=1"
            )
        from atroposlib.envs.server_handling.dummy_managed_server import DummyManagedServer

        warnings.warn(
            "Using DummyManagedServer with an OpenAI endpoint: token IDs and logprobs are "
            "placeholders, NOT suitable for training",
            stacklevel=3,
        )
        return DummyManagedServer(server=server, tokenizer=tokenizer)

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
