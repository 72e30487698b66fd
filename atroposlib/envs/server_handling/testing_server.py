"""Canned inference for `testing=True`: environments run end to end with no server."""

from __future__ import annotations

import time
from typing import Any

from openai.types.chat import ChatCompletion
from openai.types.completion import Completion

from atroposlib.envs.server_handling.server_baseline import APIServer

CANNED_TEXT = "This is a canned test completion."
CANNED_TOKENS = [1, 2, 3, 4]


class TestingServer(APIServer):
    __test__ = False  # not a pytest class

    async def probe(self) -> bool:
        return True

    async def _chat_completion_wrapper(self, **kwargs: Any) -> ChatCompletion:
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": CANNED_TEXT},
                "finish_reason": "stop",
            }
            for i in range(kwargs.get("n", 1) or 1)
        ]
        return ChatCompletion.model_validate(
            {
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": kwargs.get("model", "testing"),
                "choices": choices,
            }
        )

    async def _completion_wrapper(self, **kwargs: Any) -> Completion:
        choices = [
            {"index": i, "text": CANNED_TEXT, "finish_reason": "stop"}
            for i in range(kwargs.get("n", 1) or 1)
        ]
        return Completion.model_validate(
            {
                "id": "cmpl-test",
                "object": "text_completion",
                "created": int(time.time()),
                "model": kwargs.get("model", "testing"),
                "choices": choices,
            }
        )

    async def _tokens_and_logprobs_completion_wrapper(self, **kwargs: Any) -> Any:
        n = kwargs.get("n", 1) or 1
        prompt = list(kwargs.get("prompt", []))
        return prompt, [list(CANNED_TOKENS)] * n, [[-0.5] * len(CANNED_TOKENS)] * n, ["stop"] * n
