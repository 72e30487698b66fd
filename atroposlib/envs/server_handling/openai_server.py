"""`OpenAIServer`: any OpenAI-compatible endpoint through the official SDK.

A `base_url` of None or "" means the SDK's default endpoint (the official OpenAI
API unless `OPENAI_BASE_URL` says otherwise), as upstream's README example
relies on. Token ids and prompt logprobs are not part of the OpenAI API, so
those calls raise NotImplementedError naming the server types that have them.
"""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import openai

from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    ReasoningConfig,
    merge_choices,
    offset_seed,
)


class OpenAIServer(APIServer):
    token_ids_supported = False

    def __init__(self, config: APIServerConfig, reasoning_config: ReasoningConfig | None = None):
        super().__init__(config, reasoning_config)
        self.openai = openai.AsyncOpenAI(
            api_key=self.endpoint_key or "x",
            base_url=config.base_url or None,
            timeout=config.timeout,
            max_retries=0,  # APIServer retries with its own back-off
        )

    async def _fan_out(self, create, kwargs: dict[str, Any]) -> Any:
        """Servers that ignore `n` get n single requests, merged into one answer.

        A server found to ignore `n` (one choice back for n > 1) is remembered as such,
        with a warning, and the missing samples are requested one by one, as upstream.
        With a `seed`, request i is sent `seed + i`: one seed for all would make them
        return the same sample n times.
        """
        n = kwargs.get("n", 1) or 1
        if n == 1:
            return await create(**kwargs)
        if self.config.n_kwarg_is_ignored:
            parts = [{**kwargs, "n": 1, **offset_seed(kwargs, i)} for i in range(n)]
            return merge_choices(list(await asyncio.gather(*(create(**p) for p in parts))))
        answer = await create(**kwargs)
        if len(answer.choices) == n:
            return answer
        if len(answer.choices) != 1:
            raise ValueError(f"Expected 1 or {n} completions, got {len(answer.choices)}!")
        warnings.warn(
            f"{self.endpoint_url} ignores the n kwarg: sending n requests instead", stacklevel=2
        )
        self.config.n_kwarg_is_ignored = True
        parts = [{**kwargs, "n": 1, **offset_seed(kwargs, i)} for i in range(1, n)]
        rest = await asyncio.gather(*(create(**p) for p in parts))
        return merge_choices([answer, *rest])

    async def _chat_completion_wrapper(self, **kwargs: Any) -> Any:
        return await self._fan_out(self.openai.chat.completions.create, kwargs)

    async def _completion_wrapper(self, **kwargs: Any) -> Any:
        return await self._fan_out(self.openai.completions.create, kwargs)

    async def _tokens_and_logprobs_completion_wrapper(self, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "Tokens and logprobs are not supported by the OpenAI API: set server_type='vllm' "
            "(vLLM, or atropos-inference-server) or 'sglang'"
        )

    async def _get_logprobs_wrapper(self, **kwargs: Any) -> dict[str, Any]:
        raise NotImplementedError(
            "OpenAIServer does not implement get_logprobs: prompt logprobs are not part of "
            "the OpenAI API; set server_type='vllm' (vLLM, or atropos-inference-server)"
        )
