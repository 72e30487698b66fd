"""Reading OpenAI-style requests for the CPU inference server, as pure functions.

Design decision: everything between the validated request body and the engine
(the context-length arithmetic, the prompt forms, the chat template, the error
bodies) lives here as plain functions of their arguments. None of them touches
a model, the scheduler or FastAPI, so each one is unit-tested with fixed inputs
and a fake tokenizer (tests/inference/test_openai_requests.py); the server in
`server.py` only wires them to routes. They raise `OpenAIError` naming the
offending field, which the server turns into OpenAI's error body.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from atroposlib.inference.sampler import SamplingParams
from atroposlib.utils.image_messages import prompt_with_pictures


class OpenAIError(Exception):
    """A request the server refuses, with the HTTP status and the field to blame."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer used here, so tests can pass a small fake."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> Mapping[str, list[int]]: ...

    def __len__(self) -> int: ...

    def apply_chat_template(
        self, conversation: list[dict[str, Any]], tokenize: bool, add_generation_prompt: bool
    ) -> str: ...


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    n: int = Field(1, ge=1, le=128)
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    ignore_eos: bool = False
    return_tokens_as_token_ids: bool = False


class ChatCompletionRequest(_Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    add_generation_prompt: bool = True


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    tokens: list[int]


def error_body(status: int, message: str, param: str | None) -> dict[str, Any]:
    """The `openai` SDK picks its exception class from `type`; one spelling for every error."""
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InvalidRequestError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def validation_error_body(errors: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Pydantic's errors become one OpenAI 400 whose `param` is the first bad field."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    param = ".".join(str(p) for p in first["loc"] if p != "body") or None
    message = "; ".join(
        f"{'.'.join(str(p) for p in e['loc'] if p != 'body')}: {e['msg']}" for e in errors
    )
    return error_body(400, message, param)


def check_model(name: str, served_model_name: str) -> None:
    """Clients that ask for another model must hear 404, as from vLLM, not get this one."""
    if name != served_model_name:
        raise OpenAIError(404, f"The model `{name}` does not exist.", "model")


def check_token_ids(ids: Iterable[int], vocab: int, param: str) -> None:
    """An id outside the vocabulary would crash the embedding lookup mid-batch."""
    if any(not 0 <= t < vocab for t in ids):
        raise OpenAIError(400, f"token ids must be in [0, {vocab})", param)


def context_room(
    prompt_len: int, max_tokens: int | None, max_model_len: int, prompt_param: str
) -> int:
    """Tokens left for the completion; a prompt or `max_tokens` that does not fit is a 400."""
    room = max_model_len - prompt_len
    if room < 1:
        raise OpenAIError(
            400,
            f"prompt has {prompt_len} tokens; this model's maximum context length is "
            f"{max_model_len}",
            prompt_param,
        )
    if max_tokens is not None and max_tokens > room:
        raise OpenAIError(
            400,
            f"max_tokens {max_tokens} + prompt {prompt_len} tokens exceeds the maximum "
            f"context length {max_model_len}",
            "max_tokens",
        )
    return room


def sampling_params(
    request: _Sampling, prompt_len: int, max_tokens: int | None, top: int, max_model_len: int
) -> SamplingParams:
    """Refuse what the engine cannot do (streaming, overlong prompts) before it is queued."""
    if request.stream:
        raise OpenAIError(400, "streaming is not supported by this server", "stream")
    prompt_param = "messages" if isinstance(request, ChatCompletionRequest) else "prompt"
    room = context_room(prompt_len, max_tokens, max_model_len, prompt_param)
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    return SamplingParams(
        max_tokens=max_tokens or room,
        temperature=request.temperature,
        top_p=request.top_p,
        n=request.n,
        stop=stop,
        seed=request.seed,
        top_logprobs=top,
        ignore_eos=request.ignore_eos,
    )


def chat_sampling(
    request: ChatCompletionRequest, prompt_len: int, max_model_len: int
) -> SamplingParams:
    """Chat spells the limit two ways (`max_completion_tokens` wins) and asks for top_logprobs."""
    limit = request.max_completion_tokens or request.max_tokens
    return sampling_params(request, prompt_len, limit, request.top_logprobs or 0, max_model_len)


def completion_sampling(
    request: CompletionRequest, prompt_len: int, max_model_len: int
) -> SamplingParams:
    """Text completions take the number of top logprobs in `logprobs` itself."""
    top = request.logprobs or 0
    return sampling_params(request, prompt_len, request.max_tokens, top, max_model_len)


def chat_prompt_ids(
    tokenizer: Tokenizer, messages: list[dict[str, Any]], add_generation_prompt: bool
) -> list[int]:
    """Chat templates want string contents; OpenAI clients may send a list of text parts."""
    flat = []
    for message in messages:
        if "role" not in message:
            raise OpenAIError(400, "every message needs a 'role'", "messages")
        content = message.get("content") or ""
        if isinstance(content, list):  # OpenAI content parts
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        flat.append({**message, "content": content})
    text = tokenizer.apply_chat_template(
        flat, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def chat_prompt(
    tokenizer: Tokenizer,
    processor: Any,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
) -> tuple[list[int], list[Any]]:
    """(prompt ids, pictures): a vision-language model's processor reads the image parts
    (`atroposlib.utils.image_messages`); a text model's template gets the text parts."""
    if processor is None:
        return chat_prompt_ids(tokenizer, messages, add_generation_prompt), []
    if any("role" not in message for message in messages):
        raise OpenAIError(400, "every message needs a 'role'", "messages")
    try:
        return prompt_with_pictures(processor, messages, add_generation_prompt)
    except ValueError as bad:
        raise OpenAIError(400, str(bad), "messages") from bad


def completion_prompts(tokenizer: Tokenizer, prompt: Any) -> list[list[int]]:
    """OpenAI's `prompt` has four forms; the engine wants one list of token ids per prompt."""
    if isinstance(prompt, str):
        prompts = [tokenizer(prompt)["input_ids"]]
    elif prompt and all(isinstance(p, int) for p in prompt):
        prompts = [list(prompt)]
    else:
        prompts = [
            tokenizer(item)["input_ids"] if isinstance(item, str) else list(item) for item in prompt
        ]
    if not prompts or any(not p for p in prompts):
        raise OpenAIError(400, "prompt must not be empty", "prompt")
    check_token_ids((t for ids in prompts for t in ids), len(tokenizer), "prompt")
    return prompts


def tokenize_ids(
    tokenizer: Tokenizer, request: TokenizeRequest, processor: Any = None
) -> list[int]:
    """vLLM's `/tokenize` takes either chat messages (templated as for a chat call, image
    tokens expanded) or text."""
    if request.messages is not None:
        agp = request.add_generation_prompt
        return chat_prompt(tokenizer, processor, request.messages, agp)[0]
    if request.prompt is not None:
        return tokenizer(request.prompt, add_special_tokens=request.add_special_tokens)["input_ids"]
    raise OpenAIError(400, "give either 'prompt' or 'messages'", "prompt")
