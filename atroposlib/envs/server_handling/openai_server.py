"""`OpenAIServer`: any OpenAI-compatible endpoint through the official SDK."""

from __future__ import annotations

import asyncio
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
    def __init__(self, config: APIServerConfig, reasoning_config: ReasoningConfig | None = None):
        super().__init__(config, reasoning_config)
        self.openai = openai.AsyncOpenAI(
            api_key=config.api_key or "x",
            base_url=config.base_url or None,
            timeout=config.timeout,
            max_retries=0,  # APIServer retries with its own back-off
        )

    def _with_reasoning(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        if kwargs.pop("skip_reasoning", False):  # upstream: this call goes without reasoning
            return kwargs
        if self.reasoning_config is not None:
            extra = {**self.reasoning_config.extra_body(), **kwargs.get("extra_body", {})}
            if extra:
                kwargs = {**kwargs, "extra_body": extra}
        return kwargs

    async def _fan_out(self, create, kwargs: dict[str, Any]) -> Any:
        """Servers that ignore `n` get n single requests, merged into one answer.

        With a `seed`, request i is sent `seed + i`: one seed for all would make them
        return the same sample n times.
        """
        n = kwargs.get("n", 1) or 1
        if not self.config.n_kwarg_is_ignored or n == 1:
            return await create(**kwargs)
        parts = [{**kwargs, "n": 1, **offset_seed(kwargs, i)} for i in range(n)]
        return merge_choices(list(await asyncio.gather(*(create(**part) for part in parts))))

    async def _chat_completion_wrapper(self, **kwargs: Any) -> Any:
        return await self._fan_out(
            self.openai.chat.completions.create, self._with_reasoning(kwargs)
        )

    async def _completion_wrapper(self, **kwargs: Any) -> Any:
        return await self._fan_out(self.openai.completions.create, kwargs)

    async def _tokens_and_logprobs_completion_wrapper(self, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "token ids and logprobs need a vLLM-compatible server: set server_type='vllm' "
            "(vLLM, or atropos-inference-server)"
        )
