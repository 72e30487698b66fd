"""vLLM's native `/generate` for the CPU inference server, as pure functions.

Design decision: Atropos's `VLLMServer` client gets token ids and logprobs
from `/generate` (the route of vLLM's api_server, as upstream's own vLLM
server extends it), not from the OpenAI routes. The body
is `{"prompt": text | {"prompt_token_ids": [...]}, **SamplingParams}`; the
answer keeps vLLM's serialization, which the client indexes positionally:
one list per sample, one `[{token_id: logprob, ...}]` per token with the
sampled token's entry first, and `prompt_logprobs` with `None` for the first
prompt position and `{token_id: logprob}` (the prompt token first, then the
top k) for each later one. Parsing and shaping live here, free of the model
and of FastAPI, so the route in `server.py` stays a few lines and every
request still reaches the same scheduler and engine as the OpenAI routes.

vLLM rejects fields `SamplingParams` does not know; so do we, with a 400
naming the field. Known parameters this engine cannot honour are refused
unless they hold vLLM's neutral value, never silently ignored.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from atroposlib.inference.openai_requests import (
    OpenAIError,
    Tokenizer,
    check_token_ids,
    context_room,
)
from atroposlib.inference.sampler import GenerationJob, SamplingParams

# What JSON cannot carry (-inf for an impossible token) goes out as vLLM's OpenAI routes send it.
FLOOR_LOGPROB = -9999.0

# vLLM SamplingParams fields this server does not implement, with the value that means "off".
NEUTRAL_VALUES: dict[str, Any] = {
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_tokens": 0,
    "skip_special_tokens": True,
    "include_stop_str_in_output": False,
}


class TokensPrompt(BaseModel):
    """vLLM's `{"prompt_token_ids": [...]}` prompt form."""

    model_config = ConfigDict(extra="forbid")

    prompt_token_ids: list[int] = Field(min_length=1)


class TextPrompt(BaseModel):
    """vLLM's `{"prompt": "..."}` prompt form."""

    model_config = ConfigDict(extra="forbid")

    prompt: str


class GenerateRequest(BaseModel):
    """The body of `POST /generate`: a prompt plus vLLM `SamplingParams` fields."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    prompt: TokensPrompt | TextPrompt | str
    stream: bool = False
    model: str | None = None  # not a vLLM field; clients of the OpenAI routes send it, ignored
    n: int = Field(1, ge=1, le=128)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)  # 0 or -1: no limit
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    detokenize: bool = True
    spaces_between_special_tokens: bool = True
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False


def generate_prompt_ids(tokenizer: Tokenizer, prompt: TokensPrompt | TextPrompt | str) -> list[int]:
    """Text is tokenized with the tokenizer's special tokens, as vLLM does; ids are checked."""
    if isinstance(prompt, TokensPrompt):
        ids = list(prompt.prompt_token_ids)
    else:
        text = prompt.prompt if isinstance(prompt, TextPrompt) else prompt
        ids = tokenizer(text)["input_ids"]
    if not ids:
        raise OpenAIError(400, "prompt must not be empty", "prompt")
    check_token_ids(ids, len(tokenizer), "prompt")
    return ids


def generate_sampling(
    request: GenerateRequest, prompt_len: int, max_model_len: int, vocab: int
) -> SamplingParams:
    """The engine's parameters for a `/generate` body; what it cannot do is a 400."""
    if request.stream:
        raise OpenAIError(400, "streaming is not supported by this server", "stream")
    for name, neutral in NEUTRAL_VALUES.items():
        if getattr(request, name) != neutral:
            raise OpenAIError(
                400, f"{name}={getattr(request, name)!r} is not supported by this server", name
            )
    check_token_ids(request.stop_token_ids or [], vocab, "stop_token_ids")
    room = context_room(prompt_len, request.max_tokens, max_model_len, "prompt")
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    return SamplingParams(
        max_tokens=request.max_tokens or room,
        temperature=request.temperature,
        top_p=request.top_p,
        n=request.n,
        stop=stop,
        seed=request.seed,
        top_logprobs=request.logprobs or 0,
        ignore_eos=request.ignore_eos,
        top_k=max(request.top_k, 0),
        min_p=request.min_p,
        stop_token_ids=list(request.stop_token_ids or []),
        prompt_logprobs=request.prompt_logprobs,
    )


def _finite(value: float) -> float:
    return value if math.isfinite(value) else FLOOR_LOGPROB


def logprob_entry(token: int, logprob: float, top: Sequence[tuple[int, float]]) -> dict[str, float]:
    """vLLM's per-position dict: the chosen (or prompt) token first, then the top k by rank."""
    entry = {str(token): _finite(logprob)}
    for top_id, top_logprob in top:
        entry.setdefault(str(top_id), _finite(top_logprob))
    return entry


def prompt_logprobs_body(job: GenerationJob) -> list[dict[str, float] | None]:
    """One entry per prompt token; the first has no context, so it is None as in vLLM."""
    scored = zip(
        job.prompt_ids[1:], job.prompt_logprobs or [], job.prompt_top_logprobs or [], strict=True
    )
    return [None] + [logprob_entry(t, lp, top) for t, lp, top in scored]


def generate_body(
    request: GenerateRequest,
    job: GenerationJob,
    decode: Callable[[list[int]], str],
) -> dict[str, Any]:
    """The answer of upstream's `/generate`, plus token ids whether or not logprobs were asked."""
    prompt = request.prompt
    text = prompt if isinstance(prompt, str) else getattr(prompt, "prompt", None)
    body: dict[str, Any] = {
        "text": [s.text if request.detokenize else "" for s in job.samples],
        "prompt": text if text is not None else decode(job.prompt_ids),
        "finish_reasons": [s.finish_reason for s in job.samples],
        "prompt_token_ids": list(job.prompt_ids),
        "token_ids": [list(s.token_ids) for s in job.samples],
        "weight_versions": [s.weight_version_spans() for s in job.samples],
    }
    if request.logprobs is not None:
        body["logprobs"] = [
            [
                [logprob_entry(token, logprob, top)]
                for token, logprob, top in zip(
                    s.token_ids, s.logprobs, s.top_logprobs or [[]] * len(s.token_ids), strict=True
                )
            ]
            for s in job.samples
        ]
    if request.prompt_logprobs is not None:
        body["prompt_logprobs"] = prompt_logprobs_body(job)
    return body
