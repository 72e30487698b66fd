"""`VLLMServer`: a vLLM (or `atropos-inference-server`) endpoint.

Chat and completions go through the OpenAI SDK like `OpenAIServer`; what makes
it the vLLM client is that token-level calls (`tokens_and_logprobs_completion`,
used by `ManagedServer`) send token-id prompts and read token ids back with
vLLM's `return_tokens_as_token_ids`, so no text round-trip can shift tokens.

Token-level calls take what upstream's take: `prompt` (text, tokenized here
with the server's tokenizer) or `input_ids`/`prompt` as token ids; the chat
spellings `max_completion_tokens` / `max_new_tokens` of `max_tokens`; and any
vLLM sampling parameter (`top_k`, `min_p`, `ignore_eos`, ...), sent in the
request body since the SDK's `completions.create` has no argument for it.
"""

from __future__ import annotations

import inspect
from typing import Any

from atroposlib.envs.server_handling.openai_server import OpenAIServer

MAX_TOKEN_ALIASES = ("max_new_tokens", "max_completion_tokens")  # upstream's order: last wins
NOT_SENT = ("logprobs", "top_logprobs", "skip_reasoning")  # the call sets its own logprobs


def drop_doubled_bos(ids: list[int], bos_id: int | None) -> list[int]:
    """`ids` without its first token when it starts with two BOS (a chat template that
    writes BOS, encoded by a tokenizer that adds one)."""
    if bos_id is not None and len(ids) >= 2 and ids[0] == ids[1] == bos_id:
        return ids[1:]
    return ids


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a fresh prompt: with the tokenizer's special tokens (BOS on Llama,
    Mistral, Gemma), never with a doubled BOS."""
    ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    return drop_doubled_bos(ids, getattr(tokenizer, "bos_token_id", None))


class VLLMServer(OpenAIServer):
    _completion_args: frozenset[str] | None = None

    def _sdk_completion_args(self) -> frozenset[str]:
        if VLLMServer._completion_args is None:
            params = inspect.signature(self.openai.completions.create).parameters
            VLLMServer._completion_args = frozenset(params)
        return VLLMServer._completion_args

    def _token_request(self, kwargs: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
        """(prompt ids, SDK kwargs) for a token-level call with upstream's arguments."""
        kwargs = dict(kwargs)
        prompt = kwargs.pop("prompt", None)
        if "input_ids" in kwargs:  # upstream: input_ids (from ManagedServer) win over prompt
            prompt = kwargs.pop("input_ids")
        if prompt is None:
            raise ValueError("tokens_and_logprobs_completion needs a prompt or input_ids")
        prompt_ids = encode_prompt(self.tokenizer, prompt) if isinstance(prompt, str) else prompt
        for alias in MAX_TOKEN_ALIASES:
            if alias in kwargs:
                kwargs["max_tokens"] = kwargs.pop(alias)
        for name in NOT_SENT:
            kwargs.pop(name, None)
        extra = dict(kwargs.pop("extra_body", None) or {})
        accepted = self._sdk_completion_args()
        for name in [k for k in kwargs if k not in accepted]:
            extra[name] = kwargs.pop(name)
        extra["return_tokens_as_token_ids"] = True
        return [int(t) for t in prompt_ids], {**kwargs, "extra_body": extra}

    async def _tokens_and_logprobs_completion_wrapper(self, **kwargs: Any) -> Any:
        """Token ids in; token ids and the logprob of each out, with finish reasons."""
        prompt, request = self._token_request(kwargs)
        answer = await self._fan_out(
            self.openai.completions.create, {**request, "prompt": prompt, "logprobs": 0}
        )
        outputs, logprobs, finish = [], [], []
        for choice in answer.choices:
            outputs.append([int(t.split(":", 1)[1]) for t in choice.logprobs.tokens])
            logprobs.append([float(v) for v in choice.logprobs.token_logprobs])
            finish.append(choice.finish_reason)
        return prompt, outputs, logprobs, finish
