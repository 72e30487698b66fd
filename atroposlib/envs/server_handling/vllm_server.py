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

A token-level call posts its body through the SDK's own client (`post`, so its
auth, timeout and error types hold) but skips what `completions.create` adds: a
walk over every prompt token to transform the parameters, and a field-by-field
lenient parse of the answer, 1.7 ms of CPU out of 2.3 per call. pydantic
validates the answer instead; an answer it refuses falls back to the lenient parse.

`get_logprobs` (teacher distillation) asks vLLM's native `/generate` for
`prompt_logprobs`, upstream's contract, and normalises the per-position top-k
into parallel id / logprob lists.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from openai.types import Completion
from pydantic import ValidationError

from atroposlib.envs.server_handling.openai_server import OpenAIServer
from atroposlib.weight_sync.versions import FinishReason, choice_weight_version

MAX_TOKEN_ALIASES = ("max_new_tokens", "max_completion_tokens")  # upstream's order: last wins
NOT_SENT = ("logprobs", "top_logprobs", "skip_reasoning")  # the call sets its own logprobs
REQUEST_OPTIONS = {"timeout": "timeout", "extra_headers": "headers", "extra_query": "params"}
"""`completions.create` arguments that shape the request, not its body."""


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


def prompt_token_ids(kwargs: dict[str, Any], tokenizer: Callable[[], Any]) -> list[int]:
    """The prompt's token ids, popping `prompt` / `input_ids` from `kwargs`.

    `input_ids` win over `prompt` (upstream: ManagedServer passes both); a text prompt
    is encoded with `tokenizer()` (see `encode_prompt`), token ids are taken as given.
    """
    prompt = kwargs.pop("prompt", None)
    if "input_ids" in kwargs:
        prompt = kwargs.pop("input_ids")
    if prompt is None:
        raise ValueError("Prompt or input_ids is required")
    if isinstance(prompt, str):
        return encode_prompt(tokenizer(), prompt)
    return [int(t) for t in prompt]


class VLLMServer(OpenAIServer):
    token_ids_supported = True
    _completion_args: frozenset[str] | None = None

    def _sdk_completion_args(self) -> frozenset[str]:
        if VLLMServer._completion_args is None:
            params = inspect.signature(self.openai.completions.create).parameters
            VLLMServer._completion_args = frozenset(params)
        return VLLMServer._completion_args

    def _prompt_ids(self, kwargs: dict[str, Any]) -> list[int]:
        return prompt_token_ids(kwargs, lambda: self.tokenizer)

    def _token_request(self, kwargs: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
        """(prompt ids, SDK kwargs) for a token-level call with upstream's arguments."""
        kwargs = dict(kwargs)
        prompt_ids = self._prompt_ids(kwargs)
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
        return prompt_ids, {**kwargs, "extra_body": extra}

    async def _post_completion(self, **request: Any) -> Completion:
        """`completions.create` for a body built here (see the module docstring)."""
        extra = request.pop("extra_body", None) or {}
        options = {
            option: request.pop(argument)
            for argument, option in REQUEST_OPTIONS.items()
            if request.get(argument) is not None
        }
        body = {key: value for key, value in request.items() if value is not None}
        answer: Any = await self.openai.post(  # options: a dict
            "/completions", cast_to=object, body={**body, **extra}, options=options
        )
        try:
            return Completion.model_validate(answer)
        except ValidationError:  # a server's own variation: parsed as leniently as the SDK
            return Completion.construct(**answer)

    async def _tokens_and_logprobs_completion_wrapper(self, **kwargs: Any) -> Any:
        """Token ids in; token ids and the logprob of each out, with finish reasons."""
        prompt, request = self._token_request(kwargs)
        answer = await self._fan_out(
            self._post_completion, {**request, "prompt": prompt, "logprobs": 0}
        )
        outputs, logprobs, finish = [], [], []
        for choice in answer.choices:
            outputs.append([int(t.split(":", 1)[1]) for t in choice.logprobs.tokens])
            logprobs.append([float(v) for v in choice.logprobs.token_logprobs])
            finish.append(FinishReason(choice.finish_reason, choice_weight_version(choice)))
        return prompt, outputs, logprobs, finish

    @property
    def generate_url(self) -> str:
        """vLLM's native generation route, beside (not under) the OpenAI `/v1`."""
        return self.native_url("/generate")

    async def _get_logprobs_wrapper(self, **kwargs: Any) -> dict[str, Any]:
        """Top-k prompt logprobs from `/generate` with `prompt_logprobs` (upstream's request:
        greedy, n=1, one new token unless `max_tokens` says otherwise)."""
        kwargs = dict(kwargs)
        top_k = max(1, int(kwargs.pop("top_k", kwargs.pop("top_logprobs", 1))))
        prompt_ids = self._prompt_ids(kwargs)
        for alias in MAX_TOKEN_ALIASES:
            if alias in kwargs:
                kwargs["max_tokens"] = kwargs.pop(alias)
        kwargs.pop("model", None)
        extra = kwargs.pop("extra_body", None) or {}
        request = {
            "prompt": {"prompt_token_ids": prompt_ids},
            "prompt_logprobs": top_k,
            **kwargs,
            **extra,
            "n": 1,
            "temperature": 0.0,
            "top_p": 1.0,
        }
        request.setdefault("max_tokens", 1)
        answer = await self.post_json(self.generate_url, request)
        return normalize_prompt_logprobs(answer, prompt_ids)

    @staticmethod
    def _normalize_topk_entry(entry: Any) -> tuple[list[int], list[float]]:
        """Parallel (token ids, logprobs) of one position; see `topk_entry`."""
        return topk_entry(entry)


def topk_entry(entry: Any) -> tuple[list[int], list[float]]:
    """Parallel (token ids, logprobs) of one prompt position given as `{id: logprob}` or
    `[{id: logprob}, ...]`; anything else (vLLM's None for the first token) is empty."""
    pairs: list[tuple[Any, Any]] = []
    if isinstance(entry, dict):
        pairs = list(entry.items())
    elif isinstance(entry, list):
        pairs = [pair for item in entry if isinstance(item, dict) for pair in item.items()]
    return [int(k) for k, _ in pairs], [float(_logprob(v)) for _, v in pairs]


def _logprob(value: Any) -> float:
    """A logprob given bare or as vLLM's Logprob object (`{"logprob": x, ...}`)."""
    return value["logprob"] if isinstance(value, dict) else value


def normalize_prompt_logprobs(answer: dict[str, Any], prompt_ids: list[int]) -> dict[str, Any]:
    """`{prompt_tokens, prompt_topk_token_ids, prompt_topk_logprobs}` from a `/generate`
    answer whose `prompt_logprobs` is per position, or per sequence then position."""
    raw = answer.get("prompt_logprobs")
    if raw is None:
        raise ValueError(
            "vLLM /generate response missing 'prompt_logprobs'. "
            "Ensure backend supports prompt logprobs."
        )
    positions = raw
    if raw and isinstance(raw[0], list) and len(raw) != len(prompt_ids):
        positions = raw[0]  # [sequence][position]
    ids, logprobs = [], []
    for entry in positions:
        entry_ids, entry_logprobs = topk_entry(entry)
        ids.append(entry_ids)
        logprobs.append(entry_logprobs)
    return {
        "prompt_tokens": list(prompt_ids),
        "prompt_topk_token_ids": ids,
        "prompt_topk_logprobs": logprobs,
    }
