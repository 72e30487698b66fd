"""`SGLangServer`: an SGLang endpoint (`server_type="sglang"`).

SGLang speaks the OpenAI API for chat and completions, so those go through the
SDK as for `OpenAIServer`; token-level calls (ManagedServer) use SGLang's
native `/generate` with `input_ids` and `return_logprob`, upstream's request,
because only that returns token ids with their logprobs.
"""

from __future__ import annotations

from typing import Any

from atroposlib.envs.server_handling.openai_server import OpenAIServer
from atroposlib.envs.server_handling.vllm_server import MAX_TOKEN_ALIASES, prompt_token_ids

NOT_SAMPLING = ("logprobs", "top_logprobs", "skip_reasoning", "model")


def finish_reason_of(meta_info: dict[str, Any]) -> str | None:
    """SGLang reports `{"type": "stop", ...}`; OpenAI shapes want the bare reason."""
    reason = meta_info.get("finish_reason")
    return reason.get("type") if isinstance(reason, dict) else reason


class SGLangServer(OpenAIServer):
    token_ids_supported = True

    @property
    def generate_url(self) -> str:
        return self.native_url("/generate")

    async def _tokens_and_logprobs_completion_wrapper(
        self, **kwargs: Any
    ) -> tuple[list, list, list, list]:
        """Token ids in; per sample the token ids, their logprobs and the finish reason."""
        sampling = dict(kwargs)
        prompt_ids = prompt_token_ids(sampling, lambda: self.tokenizer)
        for alias in ("max_tokens", *MAX_TOKEN_ALIASES):
            if alias in sampling:
                sampling["max_new_tokens"] = sampling.pop(alias)
        for name in NOT_SAMPLING:
            sampling.pop(name, None)
        sampling.update(sampling.pop("extra_body", None) or {})
        request = {
            "input_ids": prompt_ids,
            "sampling_params": sampling,
            "return_logprob": True,
            "return_text_in_logprobs": False,
        }
        answers = await self.post_json(self.generate_url, request)
        if not isinstance(answers, list):
            answers = [answers]
        outputs, logprobs, finish = [], [], []
        for answer in answers:
            meta = answer.get("meta_info", {})
            entries = meta.get("output_token_logprobs", [])  # (logprob, token id, text)
            outputs.append([int(entry[1]) for entry in entries])
            logprobs.append([float(entry[0]) for entry in entries])
            finish.append(finish_reason_of(meta))
        return prompt_ids, outputs, logprobs, finish

    async def _get_logprobs_wrapper(self, **kwargs: Any) -> dict[str, Any]:
        raise NotImplementedError(
            "SGLangServer does not implement get_logprobs (nor does upstream's): prompt "
            "logprobs need server_type='vllm' (vLLM, or atropos-inference-server)"
        )
