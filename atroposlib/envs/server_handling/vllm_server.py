"""`VLLMServer`: a vLLM (or `atropos-inference-server`) endpoint.

Chat and completions go through the OpenAI SDK like `OpenAIServer`; what makes
it the vLLM client is that token-level calls (`tokens_and_logprobs_completion`,
used by `ManagedServer`) send token-id prompts and read token ids back with
vLLM's `return_tokens_as_token_ids`, so no text round-trip can shift tokens.
"""

from __future__ import annotations

from typing import Any

from atroposlib.envs.server_handling.openai_server import OpenAIServer


class VLLMServer(OpenAIServer):
    async def _tokens_and_logprobs_completion_wrapper(self, **kwargs: Any) -> Any:
        """Token ids in; token ids and the logprob of each out, with finish reasons."""
        prompt = kwargs.pop("prompt", None)
        if prompt is None and "input_ids" in kwargs:
            prompt = kwargs.pop("input_ids")
        if isinstance(prompt, str):
            raise ValueError("tokens_and_logprobs_completion needs a prompt of token ids")
        extra = {**kwargs.pop("extra_body", {}), "return_tokens_as_token_ids": True}
        kwargs.pop("logprobs", None)
        answer = await self._fan_out(
            self.openai.completions.create,
            {**kwargs, "prompt": list(prompt), "logprobs": 0, "extra_body": extra},
        )
        outputs, logprobs, finish = [], [], []
        for choice in answer.choices:
            outputs.append([int(t.split(":", 1)[1]) for t in choice.logprobs.tokens])
            logprobs.append([float(v) for v in choice.logprobs.token_logprobs])
            finish.append(choice.finish_reason)
        return list(prompt), outputs, logprobs, finish
