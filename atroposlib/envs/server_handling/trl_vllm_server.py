"""`TrlVllmServer`: TRL's vLLM server (`trl vllm-serve`, `server_type="trl"`).

That server has no OpenAI API: it takes rendered prompts at `POST /generate/`
and answers `completion_ids`. Chat prompts are rendered here with the model's
chat template and answers decoded into OpenAI shapes, as upstream does. It
returns no logprobs, so token-level calls (ManagedServer) and prompt logprobs
raise NotImplementedError.
"""

from __future__ import annotations

from typing import Any

from openai.types.chat import ChatCompletion
from openai.types.completion import Completion

from atroposlib.envs.server_handling.server_baseline import APIServer
from atroposlib.utils.openai_shapes import chat_choice, completion_body, text_choice

# upstream's defaults for what the request leaves out
SAMPLING_DEFAULTS = {
    "n": 1,
    "repetition_penalty": 1.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "max_tokens": 1024,
}


class TrlVllmServer(APIServer):
    token_ids_supported = False

    @property
    def generate_url(self) -> str:
        return self.endpoint_url + "/generate/"  # TRL's server has no /v1

    async def _generate(self, prompt: str, kwargs: dict[str, Any]) -> list[list[int]]:
        body: dict[str, Any] = {"prompts": [prompt]}
        for name, default in SAMPLING_DEFAULTS.items():
            value = kwargs.get(name)
            body[name] = default if value is None else value
        return (await self.post_json(self.generate_url, body))["completion_ids"]

    def _finish(self, ids: list[int]) -> str:
        return "stop" if self.tokenizer.eos_token_id in ids else "length"

    async def _chat_completion_wrapper(self, **kwargs: Any) -> ChatCompletion:
        prompt = self.tokenizer.apply_chat_template(
            kwargs.get("messages", []), tokenize=False, add_generation_prompt=True
        )
        answers = await self._generate(prompt, kwargs)
        choices = [
            chat_choice(i, self.tokenizer.decode(ids), self._finish(ids))
            for i, ids in enumerate(answers)
        ]
        body = completion_body("chat", self.config.model_name, choices)
        return ChatCompletion.model_validate(body)

    async def _completion_wrapper(self, **kwargs: Any) -> Completion:
        answers = await self._generate(kwargs.get("prompt", ""), kwargs)
        choices = [
            text_choice(i, self.tokenizer.decode(ids), self._finish(ids))
            for i, ids in enumerate(answers)
        ]
        return Completion.model_validate(completion_body("text", self.config.model_name, choices))

    async def _tokens_and_logprobs_completion_wrapper(self, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "TRL's vLLM server returns no logprobs, so token-level calls (ManagedServer) "
            "need server_type='vllm' or 'sglang'"
        )
