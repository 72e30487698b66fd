"""Inference server configs, reasoning settings, and the client base class.

`APIServer` owns what is the same for every backend: a concurrency limit for
training requests and a separate one for evaluation (semaphores whose usable
share follows the env's weight, as upstream), retries with exponential back-off
on errors that retrying can fix, a health flag the manager routes by, the
reasoning settings a chat request carries, and request timings for logging.
Subclasses implement only the wire calls (`_chat_completion_wrapper`,
`_completion_wrapper`, `_tokens_and_logprobs_completion_wrapper`, and
`_get_logprobs_wrapper` where the backend has prompt logprobs).

`ReasoningConfig` keeps upstream's dataclass API and wire shapes, because
providers disagree: the official OpenAI API takes a top-level
`reasoning_effort` (and `max_completion_tokens`, temperature 1), OpenRouter
style providers and vLLM take a `reasoning` object.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import random
import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, Field

from atroposlib.envs.server_handling.request_policy import (  # noqa: F401 - re-exported
    NO_SUCH_ROUTE,
    RETRYABLE_STATUS,
    is_retryable,
    is_unreachable,
    merge_choices,
    offset_seed,
)
from atroposlib.utils.exposure import ENGINE_KEY_ENVIRONMENT, key_issued_for

logger = logging.getLogger("atroposlib.inference")
OUTAGE_LOGGER = "atroposlib.inference.outage"
"""An outage's whole story (URLs, the error, the wait's limit) at DEBUG, for log files
(`keep_debug_in_files`); the console gets a short line on `logger`."""
outage_logger = logging.getLogger(OUTAGE_LOGGER)

OPENAI_DEFAULT_URL = "https://api.openai.com/v1"
VALID_REASONING_EFFORTS = {"none", "minimal", "low", "medium", "high", "xhigh"}


def is_openai_official(base_url: str | None) -> bool:
    """True for the official OpenAI endpoint, which takes reasoning settings its own way."""
    return bool(base_url and "api.openai.com" in base_url)


@dataclass
class ReasoningConfig:
    """Thinking-mode settings the servers add to every chat request.

    Giving an `effort` or a `max_tokens` budget turns reasoning on by itself.
    `custom_prompt` (not upstream's) carries the env's `custom_thinking_prompt`
    for envs that read it; it is never sent.
    """

    enabled: bool = False
    effort: str | None = None
    max_tokens: int | None = None
    custom_prompt: str | None = None

    # Budget per effort level for providers that only take a token limit
    # (percentages of a 32k budget: 10, 20, 50, 80 and 95; "none" the minimum).
    EFFORT_TO_MAX_TOKENS: ClassVar[dict[str, int]] = {
        "none": 1024,
        "minimal": 3200,
        "low": 6400,
        "medium": 16000,
        "high": 25600,
        "xhigh": 30400,
    }

    def __post_init__(self) -> None:
        if self.effort is not None and self.effort not in VALID_REASONING_EFFORTS:
            raise ValueError(
                f"Invalid reasoning_effort: {self.effort!r}. "
                f"Must be one of: {sorted(VALID_REASONING_EFFORTS)}"
            )
        if self.effort is not None or self.max_tokens is not None:
            self.enabled = True

    def is_reasoning_kwargs_active(self) -> bool:
        """Whether requests carry reasoning settings."""
        return self.enabled

    def build_extra_body(
        self, base_url: str | None = None, use_max_tokens: bool = False
    ) -> dict[str, Any] | None:
        """The request fields for `base_url`'s provider, or None when reasoning is off.

        Official OpenAI: `{"reasoning_effort": effort or "medium"}`. Anyone else:
        `{"reasoning": {"enabled": True, ...}}` with the effort, else the token budget
        (providers take one of the two); `use_max_tokens` sends an effort as its budget
        from `EFFORT_TO_MAX_TOKENS`.
        """
        if not self.is_reasoning_kwargs_active():
            return None
        if is_openai_official(base_url):
            return {"reasoning_effort": self.effort or "medium"}
        reasoning: dict[str, Any] = {"enabled": True}
        if self.effort is not None and use_max_tokens:
            reasoning["max_tokens"] = self.EFFORT_TO_MAX_TOKENS.get(self.effort, 8192)
        elif self.effort is not None:
            reasoning["effort"] = self.effort
        elif self.max_tokens is not None:
            reasoning["max_tokens"] = self.max_tokens
        return {"reasoning": reasoning}

    @classmethod
    def from_env_config(cls, env_config: Any) -> ReasoningConfig:
        """The settings of a `BaseEnvConfig` (or any object with its reasoning fields):
        `thinking_mode`, `reasoning_effort`, `max_reasoning_tokens`, and
        `custom_thinking_prompt`; missing fields count as unset."""
        effort = getattr(env_config, "reasoning_effort", None)
        max_tokens = getattr(env_config, "max_reasoning_tokens", None)
        return cls(
            enabled=bool(getattr(env_config, "thinking_mode", False))
            or effort is not None
            or max_tokens is not None,
            effort=effort,
            max_tokens=max_tokens,
            custom_prompt=getattr(env_config, "custom_thinking_prompt", None),
        )


class AsyncSemWithAdaptiveWeight(asyncio.Semaphore):
    """A semaphore that hands out only the top `weight` share of its slots.

    `min_val()` slots are held back: with weight 0.25 on 512 slots, a request
    waits once 128 are in use. The env sets the weight from its share of the
    trainer's batches, so a low-weight env does not flood a shared server.
    """

    def __init__(self, value: int):
        super().__init__(value=value)
        self.max_val = value
        self.weight = 1.0

    def update_weight(self, weight: float) -> None:
        """Set the usable share; waiters that now fit are let in."""
        self.weight = weight
        while self._value > self.min_val() and self._has_waiter():
            self._wake_up_next()

    def min_val(self) -> float:
        """The number of slots held back."""
        return self.max_val * (1.0 - self.weight)

    def _has_waiter(self) -> bool:
        return any(not w.done() for w in (self._waiters or ()))

    def locked(self) -> bool:
        return self._value <= self.min_val() or any(
            not w.cancelled() for w in (self._waiters or ())
        )

    def release(self) -> None:
        self._value += 1
        if self._value > self.min_val():
            self._wake_up_next()

    async def acquire(self) -> Literal[True]:
        if not self.locked():
            self._value -= 1
            return True
        if self._waiters is None:
            self._waiters = collections.deque()
        # asyncio.mixins._LoopBoundMixin._get_loop, private, so not in typeshed
        waiter = self._get_loop().create_future()  # type: ignore[attr-defined]
        self._waiters.append(waiter)
        try:
            try:
                await waiter
            finally:
                self._waiters.remove(waiter)
        except asyncio.CancelledError:
            if not waiter.cancelled():  # woken, then cancelled: give the slot on
                self._value += 1
                self._wake_up_next()
            raise
        if self._value > self.min_val():
            self._wake_up_next()
        return True


class ServerBaseline(BaseModel):
    """Settings shared by every inference server (no address: default local servers)."""

    timeout: int = Field(1200, description="Seconds before a request is abandoned.")
    num_max_requests_at_once: int = Field(512, description="Concurrent training requests.")
    num_requests_for_eval: int = Field(64, description="Concurrent evaluation requests.")
    model_name: str = Field("default", description="Model name sent with each request.")
    rolling_buffer_length: int = Field(1000, description="Request timings kept for metrics.")
    server_type: Literal["openai", "trl", "sglang", "vllm"] = Field(
        "openai", description="Client to use: openai (any OpenAI API), vllm, sglang, trl."
    )
    tokenizer_name: str = Field("none", description="Tokenizer; 'none' means model_name's.")


class APIServerConfig(ServerBaseline):
    """One inference server at a known address."""

    api_key: str | None = Field("", description="Bearer key for the server.")
    base_url: str | None = Field(
        "",
        description="OpenAI-compatible base URL, e.g. http://host:9001/v1; None or empty: "
        "the OpenAI SDK's default (OPENAI_BASE_URL, else the official OpenAI API).",
    )
    n_kwarg_is_ignored: bool = Field(
        False, description="The server ignores `n`: send n requests instead."
    )
    health_check: bool = Field(True, description="Probe /health and route around a dead server.")


class APIServer(ABC):
    token_ids_supported = True  # token-level calls work (False: text-only APIs)
    inherits_environment_keys = True
    """False: only `api_key` is sent, never a key from the environment (endpoint_key)."""
    max_attempts = 3
    backoff_s = 0.5

    def __init__(self, config: APIServerConfig, reasoning_config: ReasoningConfig | None = None):
        self.config = config
        self.reasoning_config = reasoning_config
        self.sem = AsyncSemWithAdaptiveWeight(config.num_max_requests_at_once)
        self.eval_sem = AsyncSemWithAdaptiveWeight(config.num_requests_for_eval)
        self.server_healthy = True
        self.request_timings: deque[float] = deque(maxlen=config.rolling_buffer_length)
        self.eval_request_timings: deque[float] = deque(maxlen=config.rolling_buffer_length)
        self.attempts_list: deque[int] = deque(maxlen=config.rolling_buffer_length)
        self.eval_attempts_list: deque[int] = deque(maxlen=config.rolling_buffer_length)
        self.attempts_failed = 0
        self.requests_made = 0
        self.check_task: asyncio.Task | None = None
        # a subclass may have set `tokenizer` before calling this (upstream's VLLMServer does)
        self._tokenizer: Any = getattr(self, "_tokenizer", None)

    @property
    def tokenizer(self) -> Any:
        """The served model's tokenizer: `tokenizer_name`, or `model_name` when that is 'none'.

        Loaded as `AutoTokenizer` would (utils/tokenizers.py) on first use (upstream loads
        it when a vLLM client is made); a name that cannot be loaded raises ValueError
        saying what to set.
        """
        if self._tokenizer is None:
            name = self.config.tokenizer_name
            if not name or name == "none":
                name = self.config.model_name
            from atroposlib.utils.tokenizers import TokenizerLoadError, load_tokenizer

            try:
                self._tokenizer = load_tokenizer(name, f"the server config of {self.endpoint_url}")
            except TokenizerLoadError as exc:
                raise ValueError(
                    f"{exc}. Set tokenizer_name in the server config to a hub name or "
                    "directory, or pass tokenizer= to managed_server()"
                ) from None
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        self._tokenizer = value

    @property
    def endpoint_url(self) -> str:
        """Where requests go: `base_url`, or for None / "" the OpenAI SDK's default
        (`OPENAI_BASE_URL`, else the official OpenAI API)."""
        return (
            self.config.base_url or os.environ.get("OPENAI_BASE_URL") or OPENAI_DEFAULT_URL
        ).rstrip("/")

    @property
    def address(self) -> str:
        """The endpoint's host and port, which name the server in a short console line."""
        return urlsplit(self.endpoint_url).netloc or self.endpoint_url

    @property
    def endpoint_key(self) -> str:
        """The bearer key sent: `api_key`; else $ATROPOS_ENGINE_API_KEY (how atropos-launch
        hands an environment its engine's key, out of argv), only to the engines it was
        issued for ($ATROPOS_ENGINE_URLS); else, for None, `OPENAI_API_KEY` (as the SDK
        does). A server added at run time (the proxy's /setup) inherits neither."""
        key = self.config.api_key
        if key or not self.inherits_environment_keys:
            return key or ""
        launched = os.environ.get(ENGINE_KEY_ENVIRONMENT[0])
        if launched and key_issued_for(self.endpoint_url):
            return launched
        return os.environ.get("OPENAI_API_KEY", "") if key is None else ""

    # -- capacity and health ------------------------------------------------
    def free_slots(self, split: str = "train") -> float:
        """Slots this server can take now for `split` (its weight's share, as upstream)."""
        sem = self.sem if split == "train" else self.eval_sem
        return sem._value - sem.min_val()

    async def update_weight(self, weight: float) -> None:
        """Let this env use only `weight` (0..1] of the server's concurrency limits."""
        self.sem.update_weight(weight)
        self.eval_sem.update_weight(weight)

    def native_url(self, route: str) -> str:
        """A route of the server itself (/health, /generate), beside its OpenAI `/v1`."""
        base = self.endpoint_url
        return (base[: -len("/v1")] if base.endswith("/v1") else base) + route

    @property
    def auth_headers(self) -> dict[str, str]:
        key = self.endpoint_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def post_json(self, url: str, body: Any) -> Any:
        """POST to one of the server's native routes (bearer key, request timeout); its JSON."""
        async with httpx.AsyncClient(timeout=self.config.timeout, headers=self.auth_headers) as c:
            response = await c.post(url, json=body)
            response.raise_for_status()
            return response.json()

    @property
    def health_url(self) -> str:
        return self.native_url("/health")

    async def probe(self) -> bool:
        """One health probe; updates `server_healthy`.

        GET /health (vLLM, sglang, atropos-inference-server). A server with no such route
        (hosted OpenAI-compatible APIs answer 404) is healthy when its model list answers.
        """
        try:
            async with httpx.AsyncClient(timeout=5, headers=self.auth_headers) as client:
                status = (await client.get(self.health_url)).status_code
                if status in NO_SUCH_ROUTE:
                    status = (await client.get(self.endpoint_url + "/models")).status_code
                healthy = status == 200
        except httpx.HTTPError:
            healthy = False
        if healthy != self.server_healthy:  # host:port, so the line fits the launcher's console
            if healthy:
                logger.info("inference server %s is back", self.address)
            else:
                logger.warning("inference server %s down", self.address)
        self.server_healthy = healthy
        return healthy

    async def check_server_status_task(self, chat_completion: bool = True) -> None:
        """Probe the server every second for ever (upstream's health task; the
        `ServerManager` runs its own probes, so nothing here starts this)."""
        while True:
            await self.probe()
            await asyncio.sleep(1)

    # -- reasoning ----------------------------------------------------------
    def _inject_reasoning_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """`kwargs` with the reasoning settings for this server's provider; a caller's
        `skip_reasoning=True` sends the request without them.

        Official OpenAI also gets upstream's fixes for reasoning models: temperature 1
        and `max_completion_tokens` in place of `max_tokens`.
        """
        if kwargs.pop("skip_reasoning", False):
            return kwargs
        config = self.reasoning_config
        if config is None or not config.is_reasoning_kwargs_active():
            return kwargs
        url = self.endpoint_url
        extra = config.build_extra_body(url)
        if extra:
            kwargs["extra_body"] = {**(kwargs.get("extra_body") or {}), **extra}
        if is_openai_official(url):
            kwargs["temperature"] = 1.0
            if kwargs.get("max_tokens"):
                kwargs["max_completion_tokens"] = kwargs.pop("max_tokens")
        return kwargs

    # -- public calls -------------------------------------------------------
    async def chat_completion(self, **kwargs: Any) -> Any:
        """A chat completion, with the reasoning settings (unless `skip_reasoning=True`)."""
        return await self._call(
            self._chat_completion_wrapper, self._inject_reasoning_kwargs(kwargs)
        )

    async def completion(self, **kwargs: Any) -> Any:
        """A text completion (no reasoning settings: the completions API has none)."""
        return await self._call(self._completion_wrapper, kwargs)

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> Any:
        """(prompt_tokens, [output_tokens], [output_logprobs], [finish_reasons]) for a prompt."""
        return await self._call(self._tokens_and_logprobs_completion_wrapper, kwargs)

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        """Prompt logprobs of `prompt` (text) or `input_ids`, top `top_k` per position:
        `{"prompt_tokens": [int], "prompt_topk_token_ids": [[int]],
        "prompt_topk_logprobs": [[float]]}`, one inner list per prompt position."""
        return await self._call(self._get_logprobs_wrapper, kwargs)

    async def _call(self, wire, kwargs: dict[str, Any]) -> Any:
        split = kwargs.pop("split", "train")
        kwargs.pop("skip_reasoning", None)  # only chat requests carry reasoning settings
        kwargs.setdefault("model", self.config.model_name)
        training = split == "train"
        semaphore = self.sem if training else self.eval_sem
        timings = self.request_timings if training else self.eval_request_timings
        attempts = self.attempts_list if training else self.eval_attempts_list
        async with semaphore:
            for attempt in range(1, self.max_attempts + 1):
                started = time.perf_counter()
                try:
                    self.requests_made += 1
                    result = await wire(**kwargs)
                    timings.append(time.perf_counter() - started)
                    attempts.append(attempt)
                    return result
                except Exception as exc:
                    self.attempts_failed += 1
                    if is_unreachable(exc) and self.config.health_check:
                        if self.server_healthy:  # once per outage, not once per request
                            # the manager warns when no server is left to route to; before
                            # any answer it is an engine still starting, no news
                            answered = self.request_timings or self.eval_request_timings
                            level = logging.INFO if answered else logging.DEBUG
                            logger.log(level, "inference server %s unreachable", self.address)
                            outage_logger.debug(
                                "inference server %s unreachable: %s", self.endpoint_url, exc
                            )
                        self.server_healthy = False  # the manager routes elsewhere
                        raise
                    if attempt == self.max_attempts or not is_retryable(exc):
                        raise
                    delay = self.backoff_s * 2 ** (attempt - 1) * (0.5 + random.random())
                    logger.warning(
                        "request to %s failed (%s); retry %d in %.1fs",
                        self.endpoint_url,
                        exc,
                        attempt,
                        delay,
                    )
                    await asyncio.sleep(delay)

    # -- metrics ------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {
            "requests": float(self.requests_made),
            "failed_attempts": float(self.attempts_failed),
        }
        for name, timings in (("train", self.request_timings), ("eval", self.eval_request_timings)):
            if timings:
                ordered = sorted(timings)
                out[f"{name}_request_time_mean"] = sum(ordered) / len(ordered)
                out[f"{name}_request_time_p95"] = ordered[int(0.95 * (len(ordered) - 1))]
        return out

    async def wandb_metrics(self, metrics_dict: dict | None, server_name: str | None) -> dict:
        metrics_dict = metrics_dict if metrics_dict is not None else {}
        prefix = f"server/{server_name or self.endpoint_url}"
        for key, value in self.metrics().items():
            metrics_dict[f"{prefix}/{key}"] = value
        return metrics_dict

    # -- wire calls ---------------------------------------------------------
    @abstractmethod
    async def _chat_completion_wrapper(self, **kwargs: Any) -> Any: ...

    @abstractmethod
    async def _completion_wrapper(self, **kwargs: Any) -> Any: ...

    @abstractmethod
    async def _tokens_and_logprobs_completion_wrapper(self, **kwargs: Any) -> Any: ...

    async def _get_logprobs_wrapper(self, **kwargs: Any) -> dict[str, Any]:
        raise NotImplementedError(
            f"{type(self).__name__} does not implement get_logprobs: prompt "
            "logprobs need a vLLM-compatible /generate endpoint (server_type='vllm')"
        )
