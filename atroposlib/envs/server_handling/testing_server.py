"""Canned inference for `testing=True`: environments run end to end with no server."""

from __future__ import annotations

from typing import Any

from openai.types.chat import ChatCompletion
from openai.types.completion import Completion

from atroposlib.envs.server_handling.server_baseline import APIServer
from atroposlib.utils.openai_shapes import chat_choice, completion_body, text_choice

CANNED_TEXT = "This is a canned test completion."
CANNED_TOKENS = [1, 2, 3, 4]


class TestingServer(APIServer):
    __test__ = False  # not a pytest class

    async def probe(self) -> bool:
        return True

    async def _chat_completion_wrapper(self, **kwargs: Any) -> ChatCompletion:
        choices = [chat_choice(i, CANNED_TEXT, "stop") for i in range(kwargs.get("n", 1) or 1)]
        model = kwargs.get("model", "testing")
        return ChatCompletion.model_validate(completion_body("chat", model, choices))

    async def _completion_wrapper(self, **kwargs: Any) -> Completion:
        choices = [text_choice(i, CANNED_TEXT, "stop") for i in range(kwargs.get("n", 1) or 1)]
        model = kwargs.get("model", "testing")
        return Completion.model_validate(completion_body("text", model, choices))

    async def _tokens_and_logprobs_completion_wrapper(self, **kwargs: Any) -> Any:
        n = kwargs.get("n", 1) or 1
        prompt = list(kwargs.get("prompt", []))
        return prompt, [list(CANNED_TOKENS)] * n, [[-0.5] * len(CANNED_TOKENS)] * n, ["stop"] * n
