"""Inference server configs and the client base class every server type shares.

`APIServer` owns what is the same for every backend: a concurrency limit for
training requests and a separate one for evaluation, retries with exponential
back-off on errors that retrying can fix, a health flag the manager routes by,
and request timings for logging. Subclasses implement only the three wire
calls (`_chat_completion_wrapper`, `_completion_wrapper`,
`_tokens_and_logprobs_completion_wrapper`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from abc import ABC, abstractmethod
from collections import deque
from typing import Any, Literal

import httpx
from pydantic import BaseModel, Field

logger = logging.getLogger("atroposlib.inference")


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
    base_url: str = Field("", description="OpenAI-compatible base URL, e.g. http://host:9001/v1.")
    n_kwarg_is_ignored: bool = Field(
        False, description="The server ignores `n`: send n requests instead."
    )
    health_check: bool = Field(True, description="Probe /health and route around a dead server.")


class ReasoningConfig(BaseModel):
    """Thinking-mode settings passed through to servers that support them."""

    enabled: bool = False
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    max_tokens: int | None = Field(None, ge=1024, le=32000)
    custom_prompt: str | None = None

    def extra_body(self) -> dict[str, Any]:
        if not self.enabled:
            return {}
        body: dict[str, Any] = {}
        if self.effort:
            body["reasoning_effort"] = self.effort
        if self.max_tokens:
            body["max_reasoning_tokens"] = self.max_tokens
        return body


def merge_choices(answers: Any) -> Any:
    """One OpenAI answer from several (a list); choices re-indexed in order, usage summed."""
    if not isinstance(answers, list):
        return answers
    merged = answers[0]
    merged.choices = [choice for answer in answers for choice in answer.choices]
    for index, choice in enumerate(merged.choices):
        choice.index = index
    if getattr(merged, "usage", None) is not None:
        for answer in answers[1:]:
            if answer.usage is not None:
                merged.usage.completion_tokens += answer.usage.completion_tokens
                merged.usage.total_tokens += answer.usage.completion_tokens
    return merged


def offset_seed(kwargs: dict[str, Any], offset: int) -> dict[str, Any]:
    """`{"seed": seed + offset}` for the part of a split request that starts at sample
    `offset`, or `{}` when the request has no seed; parts of one seeded request then
    draw different samples, and the same request draws the same ones again."""
    seed = kwargs.get("seed")
    return {} if seed is None else {"seed": int(seed) + offset}


RETRYABLE_STATUS = {408, 409, 429, 500, 502, 503, 504}
NO_SUCH_ROUTE = {404, 405, 501}


def is_unreachable(exc: BaseException) -> bool:
    """The server could not be reached at all (refused, reset, DNS): not worth retrying there."""
    if type(exc).__name__ == "APITimeoutError":
        return False
    return isinstance(exc, (httpx.ConnectError, ConnectionError)) or (
        type(exc).__name__ == "APIConnectionError"
    )


def is_retryable(exc: BaseException) -> bool:
    """Connection problems, timeouts and 5xx/429 are worth another try; 4xx are not."""
    status = getattr(exc, "status_code", None)
    if status is None and getattr(exc, "response", None) is not None:
        status = getattr(exc.response, "status_code", None)
    if status is not None:
        return status in RETRYABLE_STATUS
    return isinstance(
        exc, (httpx.TransportError, asyncio.TimeoutError, ConnectionError, OSError)
    ) or (type(exc).__name__ in ("APIConnectionError", "APITimeoutError"))


class APIServer(ABC):
    max_attempts = 3
    backoff_s = 0.5

    def __init__(self, config: APIServerConfig, reasoning_config: ReasoningConfig | None = None):
        self.config = config
        self.reasoning_config = reasoning_config
        self.sem = asyncio.Semaphore(config.num_max_requests_at_once)
        self.eval_sem = asyncio.Semaphore(config.num_requests_for_eval)
        self.server_healthy = True
        self.request_timings: deque[float] = deque(maxlen=config.rolling_buffer_length)
        self.eval_request_timings: deque[float] = deque(maxlen=config.rolling_buffer_length)
        self.attempts_failed = 0
        self.requests_made = 0
        # a subclass may have set `tokenizer` before calling this (upstream's VLLMServer does)
        self._tokenizer: Any = getattr(self, "_tokenizer", None)

    @property
    def tokenizer(self) -> Any:
        """The served model's tokenizer: `tokenizer_name`, or `model_name` when that is 'none'.

        Loaded with `AutoTokenizer` on first use (upstream loads it when a vLLM client is
        made); a name that cannot be loaded raises ValueError saying what to set.
        """
        if self._tokenizer is None:
            name = self.config.tokenizer_name
            if not name or name == "none":
                name = self.config.model_name
            try:
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(name)
            except Exception as exc:
                raise ValueError(
                    f"cannot load the tokenizer {name!r} for {self.config.base_url}: {exc}. "
                    "Set tokenizer_name in the server config to a hub name or directory, "
                    "or pass tokenizer= to managed_server()"
                ) from exc
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        self._tokenizer = value

    # -- capacity and health ------------------------------------------------
    def free_slots(self, split: str = "train") -> int:
        return (self.eval_sem if split == "eval" else self.sem)._value

    @property
    def health_url(self) -> str:
        base = self.config.base_url.rstrip("/")
        return (base[: -len("/v1")] if base.endswith("/v1") else base) + "/health"

    async def probe(self) -> bool:
        """One health probe; updates `server_healthy`.

        GET /health (vLLM, sglang, atropos-inference-server). A server with no such route
        (hosted OpenAI-compatible APIs answer 404) is healthy when its model list answers.
        """
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        try:
            async with httpx.AsyncClient(timeout=5, headers=headers) as client:
                status = (await client.get(self.health_url)).status_code
                if status in NO_SUCH_ROUTE:
                    models = self.config.base_url.rstrip("/") + "/models"
                    status = (await client.get(models)).status_code
                healthy = status == 200
        except httpx.HTTPError:
            healthy = False
        if healthy != self.server_healthy:
            if healthy:
                logger.info("inference server %s is back", self.config.base_url)
            else:
                logger.warning("inference server %s is down", self.config.base_url)
        self.server_healthy = healthy
        return healthy

    # -- public calls -------------------------------------------------------
    async def chat_completion(self, **kwargs: Any) -> Any:
        return await self._call(self._chat_completion_wrapper, kwargs)

    async def completion(self, **kwargs: Any) -> Any:
        return await self._call(self._completion_wrapper, kwargs)

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> Any:
        """(prompt_tokens, [output_tokens], [output_logprobs], [finish_reasons]) for a prompt."""
        return await self._call(self._tokens_and_logprobs_completion_wrapper, kwargs)

    async def _call(self, wire, kwargs: dict[str, Any]) -> Any:
        split = kwargs.pop("split", "train")
        kwargs.setdefault("model", self.config.model_name)
        semaphore = self.eval_sem if split == "eval" else self.sem
        timings = self.eval_request_timings if split == "eval" else self.request_timings
        async with semaphore:
            for attempt in range(1, self.max_attempts + 1):
                started = time.perf_counter()
                try:
                    self.requests_made += 1
                    result = await wire(**kwargs)
                    timings.append(time.perf_counter() - started)
                    return result
                except Exception as exc:
                    self.attempts_failed += 1
                    if is_unreachable(exc) and self.config.health_check:
                        if self.server_healthy:  # once per outage, not once per request
                            logger.warning(
                                "inference server %s unreachable: %s", self.config.base_url, exc
                            )
                        self.server_healthy = False  # the manager routes elsewhere
                        raise
                    if attempt == self.max_attempts or not is_retryable(exc):
                        raise
                    delay = self.backoff_s * 2 ** (attempt - 1) * (0.5 + random.random())
                    logger.warning(
                        "request to %s failed (%s); retry %d in %.1fs",
                        self.config.base_url,
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
        prefix = f"server/{server_name or self.config.base_url}"
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
