"""`ServerHarness`: the scriptable fake server behind `ServerManager(testing=True)`.

Upstream's API: `ServerHarness()` takes no arguments; a test scripts answers
with `set_desired_response(messages, ChatCompletion)`,
`set_desired_completion(prompt, Completion)` and
`set_tokens_and_logprobs_response(prompt, ...)`, and may assign `tokenizer`
and `config`. Unlike upstream, which answers None to anything not scripted,
an unscripted request gets a canned answer (n choices of `CANNED_TEXT`, or
`CANNED_TOKENS` per sample), so an environment runs end to end with no server
and no script. It is a real `APIServer`, so requests go through the same
semaphores, timings and routing as against a real server.
"""

from __future__ import annotations

from typing import Any, Literal

from openai.types.chat import ChatCompletion
from openai.types.completion import Completion

from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    ReasoningConfig,
)
from atroposlib.utils.openai_shapes import chat_choice, completion_body, text_choice

CANNED_TEXT = "This is a canned test completion."
CANNED_TOKENS = [1, 2, 3, 4]
CANNED_LOGPROB = -0.5

FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]


def _per_choice(value: Any, index: int) -> Any:
    return value if isinstance(value, str) else value[index]


def create_chat_completion(
    resp: str | list[str], n: int = 1, finish_reason: FinishReason | list[FinishReason] = "stop"
) -> ChatCompletion:
    """A ChatCompletion of `n` choices: `resp` for each, or `resp[i]` for choice i."""
    choices = [
        chat_choice(i, _per_choice(resp, i), _per_choice(finish_reason, i)) for i in range(n)
    ]
    body = {**completion_body("chat", "test_model", choices), "id": "test_id", "created": 0}
    return ChatCompletion.model_validate(body)


def create_completion(
    resp: str | list[str], n: int = 1, finish_reason: FinishReason | list[FinishReason] = "stop"
) -> Completion:
    """A Completion of `n` choices: `resp` for each, or `resp[i]` for choice i."""
    choices = [
        text_choice(i, _per_choice(resp, i), _per_choice(finish_reason, i)) for i in range(n)
    ]
    body = {**completion_body("text", "test_model", choices), "id": "test_id", "created": 0}
    return Completion.model_validate(body)


def _copy(answer: Any) -> Any:
    """A scripted answer, copied so that merging split requests cannot alter the script."""
    return answer.model_copy(deep=True) if hasattr(answer, "model_copy") else answer


class ServerHarness(APIServer):
    __test__ = False  # not a pytest class

    def __init__(
        self,
        config: APIServerConfig | None = None,
        reasoning_config: ReasoningConfig | None = None,
    ) -> None:
        config = config or APIServerConfig(model_name="testing", health_check=False)
        super().__init__(config, reasoning_config)
        self.response_map: dict[str, Any] = {}
        self.tokens_and_logprobs_map: dict[str, tuple[list, list, list, list]] = {}

    def conv_to_dictkey(self, input_message: list[dict[str, str]]) -> str:
        """The lookup key of a conversation: its roles and contents, in order."""
        return "\n".join(
            line
            for message in input_message
            for line in (f"role:{message['role']}", f"content:{message['content']}")
        )

    def set_desired_response(
        self, input_message: list[dict[str, str]], desired_response: ChatCompletion
    ) -> None:
        """Answer `desired_response` to a chat request with these messages."""
        self.response_map[self.conv_to_dictkey(input_message)] = desired_response

    def set_desired_completion(self, input_message: str, completion: Completion) -> None:
        """Answer `completion` to a completion request with this prompt."""
        self.response_map[input_message] = completion

    def set_tokens_and_logprobs_response(
        self,
        prompt: str,
        prompt_tokens: list,
        output_tokens_list: list,
        output_logprobs_list: list,
        finish_reasons: list,
    ) -> None:
        """Answer a token-level request for `prompt` with these lists (one per sample)."""
        self.tokens_and_logprobs_map[prompt] = (
            prompt_tokens,
            output_tokens_list,
            output_logprobs_list,
            finish_reasons,
        )

    async def probe(self) -> bool:
        self.server_healthy = True
        return True

    async def _chat_completion_wrapper(self, **kwargs: Any) -> ChatCompletion:
        messages = kwargs.get("messages") or []
        scripted = self.response_map.get(self.conv_to_dictkey(messages))
        if scripted is not None:
            return _copy(scripted)
        n = kwargs.get("n", 1) or 1
        choices = [chat_choice(i, CANNED_TEXT, "stop") for i in range(n)]
        model = kwargs.get("model") or "testing"
        return ChatCompletion.model_validate(completion_body("chat", model, choices))

    async def _completion_wrapper(self, **kwargs: Any) -> Completion:
        prompt = kwargs.get("prompt")
        scripted = self.response_map.get(prompt) if isinstance(prompt, str) else None
        if scripted is not None:
            return _copy(scripted)
        n = kwargs.get("n", 1) or 1
        choices = [text_choice(i, CANNED_TEXT, "stop") for i in range(n)]
        model = kwargs.get("model") or "testing"
        return Completion.model_validate(completion_body("text", model, choices))

    async def _tokens_and_logprobs_completion_wrapper(
        self, **kwargs: Any
    ) -> tuple[list, list, list, list]:
        prompt = kwargs.get("prompt")
        if isinstance(prompt, str) and prompt in self.tokens_and_logprobs_map:
            return self.tokens_and_logprobs_map[prompt]
        n = kwargs.get("n", 1) or 1
        if kwargs.get("input_ids") is not None:
            prompt_tokens = list(kwargs["input_ids"])
        elif isinstance(prompt, str):
            tokenizer = self._tokenizer
            prompt_tokens = list(tokenizer.encode(prompt)) if tokenizer is not None else []
        else:
            prompt_tokens = list(prompt or [])
        return (
            prompt_tokens,
            [list(CANNED_TOKENS) for _ in range(n)],
            [[CANNED_LOGPROB] * len(CANNED_TOKENS) for _ in range(n)],
            ["stop"] * n,
        )
