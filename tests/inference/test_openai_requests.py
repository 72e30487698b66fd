"""The inference server's request parsing and answer shapes, without a model.

Every expected value below was worked out by hand from the OpenAI/vLLM
contract, using a fake tokenizer whose tokens are characters (id = ord(c)).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")  # engine.py (SamplingParams, Sample) imports it

from atroposlib.inference.openai_requests import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIError,
    TokenizeRequest,
    chat_prompt_ids,
    chat_sampling,
    check_model,
    check_token_ids,
    completion_prompts,
    completion_sampling,
    error_body,
    sampling_params,
    tokenize_ids,
    validation_error_body,
)
from atroposlib.inference.routes import chat_choices, text_choices
from atroposlib.inference.sampler import Sample, SamplingParams
from atroposlib.utils.openai_shapes import (
    chat_logprobs,
    completion_logprobs,
    token_text,
    usage_body,
)

USER_HI = [{"role": "u", "content": "hi"}]


class FakeTokenizer:
    """One token per character (id = ord(c)), BOS id 1 with special tokens, 128 ids."""

    def __init__(self) -> None:
        self.templated: list[list[dict[str, Any]]] = []

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        ids = [ord(c) for c in text]
        return {"input_ids": [1, *ids] if add_special_tokens else ids}

    def __len__(self) -> int:
        return 128

    def apply_chat_template(
        self, conversation: list[dict[str, Any]], tokenize: bool, add_generation_prompt: bool
    ) -> str:
        assert tokenize is False
        self.templated.append(conversation)
        text = "".join(f"<{m['role']}>{m['content']}" for m in conversation)
        return text + ("<a>" if add_generation_prompt else "")


@pytest.fixture
def tok() -> FakeTokenizer:
    return FakeTokenizer()


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=USER_HI, **fields)


def text(**fields: Any) -> CompletionRequest:
    return CompletionRequest(model="m", **{"prompt": "hi", **fields})


def refused(call, *args: Any) -> OpenAIError:
    with pytest.raises(OpenAIError) as caught:
        call(*args)
    return caught.value


# --- sampling parameters ---------------------------------------------------------------------


def test_chat_defaults_fill_the_context():
    # 50-token context, 10-token prompt, no limit given: 40 tokens of room
    assert chat_sampling(chat(), 10, 50) == SamplingParams(
        max_tokens=40, temperature=1.0, top_p=1.0, n=1, stop=[], seed=None, top_logprobs=0
    )


def test_completion_defaults_to_16_tokens_as_openai():
    assert completion_sampling(text(), 10, 50) == SamplingParams(max_tokens=16, n=1, stop=[])
    assert completion_sampling(text(max_tokens=None), 10, 50).max_tokens == 40


def test_request_fields_pass_through():
    params = chat_sampling(chat(n=4, temperature=0.0, top_p=0.5, seed=11, ignore_eos=True), 3, 20)
    assert (params.n, params.temperature, params.top_p) == (4, 0.0, 0.5)
    assert (params.seed, params.ignore_eos, params.max_tokens) == (11, True, 17)


def test_max_completion_tokens_wins_over_max_tokens():
    assert chat_sampling(chat(max_tokens=9), 3, 20).max_tokens == 9
    assert chat_sampling(chat(max_tokens=9, max_completion_tokens=4), 3, 20).max_tokens == 4


@pytest.mark.parametrize(
    ("stop", "expected"), [(None, []), ("##", ["##"]), (["a", "bc"], ["a", "bc"]), ([], [])]
)
def test_stop_is_always_a_list(stop, expected):
    assert chat_sampling(chat(stop=stop), 3, 20).stop == expected
    assert completion_sampling(text(stop=stop), 3, 20).stop == expected


def test_top_logprobs_come_from_different_fields():
    assert chat_sampling(chat(logprobs=True), 3, 20).top_logprobs == 0
    assert chat_sampling(chat(logprobs=True, top_logprobs=3), 3, 20).top_logprobs == 3
    assert completion_sampling(text(logprobs=0), 3, 20).top_logprobs == 0
    assert completion_sampling(text(logprobs=2), 3, 20).top_logprobs == 2


def test_max_tokens_may_fill_the_context_exactly():
    assert completion_sampling(text(max_tokens=5), 45, 50).max_tokens == 5
    error = refused(completion_sampling, text(max_tokens=6), 45, 50)
    assert (error.status, error.param) == (400, "max_tokens")
    assert error.message == (
        "max_tokens 6 + prompt 45 tokens exceeds the maximum context length 50"
    )


def test_a_prompt_that_fills_the_context_is_blamed_on_its_field():
    error = refused(chat_sampling, chat(), 50, 50)
    assert (error.status, error.param) == (400, "messages")
    assert error.message == "prompt has 50 tokens; this model's maximum context length is 50"
    assert refused(completion_sampling, text(), 51, 50).param == "prompt"
    assert completion_sampling(text(max_tokens=None), 49, 50).max_tokens == 1


def test_streaming_is_refused():
    error = refused(sampling_params, chat(stream=True), 3, None, 0, 20)
    assert (error.status, error.param) == (400, "stream")
    assert error.message == "streaming is not supported by this server"


def test_model_name_must_match():
    check_model("tiny", "tiny")
    error = refused(check_model, "big", "tiny")
    assert (error.status, error.param, error.message) == (
        404,
        "model",
        "The model `big` does not exist.",
    )


# --- prompts -------------------------------------------------------------------------------------


def test_completion_prompt_forms(tok):
    assert completion_prompts(tok, "hi") == [[1, 104, 105]]
    assert completion_prompts(tok, ["a", "bc"]) == [[1, 97], [1, 98, 99]]
    assert completion_prompts(tok, [5, 6]) == [[5, 6]]
    assert completion_prompts(tok, [[5], [6, 7]]) == [[5], [6, 7]]


@pytest.mark.parametrize("prompt", [[], [[]], [[5], []]])
def test_empty_prompts_are_refused(tok, prompt):
    error = refused(completion_prompts, tok, prompt)
    assert (error.status, error.param, error.message) == (400, "prompt", "prompt must not be empty")


@pytest.mark.parametrize("prompt", [[128], [-1], [[5], [6, 200]], "é"])
def test_token_ids_outside_the_vocabulary_are_refused(tok, prompt):
    error = refused(completion_prompts, tok, prompt)
    assert (error.status, error.param) == (400, "prompt")
    assert error.message == "token ids must be in [0, 128)"


def test_last_vocabulary_id_is_accepted(tok):
    assert completion_prompts(tok, [0, 127]) == [[0, 127]]
    check_token_ids([0, 127], 128, "tokens")
    assert refused(check_token_ids, [128], 128, "tokens").param == "tokens"


def test_chat_prompt_is_the_templated_text_without_special_tokens(tok):
    # "<u>hi<a>": < u > h i < a >
    assert chat_prompt_ids(tok, USER_HI, True) == [60, 117, 62, 104, 105, 60, 97, 62]
    assert chat_prompt_ids(tok, USER_HI, False) == [60, 117, 62, 104, 105]


def test_chat_content_parts_and_missing_content_become_strings(tok):
    parts = [{"type": "text", "text": "h"}, {"type": "image_url"}, "x", {"text": "i"}]
    messages = [{"role": "s"}, {"role": "u", "name": "bob", "content": parts}]
    assert chat_prompt_ids(tok, messages, False) == [60, 115, 62, 60, 117, 62, 104, 105]
    assert tok.templated[-1] == [
        {"role": "s", "content": ""},
        {"role": "u", "name": "bob", "content": "hi"},
    ]


def test_a_message_without_role_is_refused(tok):
    error = refused(chat_prompt_ids, tok, [*USER_HI, {"content": "x"}], True)
    assert (error.status, error.param) == (400, "messages")
    assert error.message == "every message needs a 'role'"
    assert tok.templated == []


def test_tokenize_takes_messages_or_text(tok):
    messages = TokenizeRequest(messages=USER_HI, add_generation_prompt=False)
    assert tokenize_ids(tok, messages) == [60, 117, 62, 104, 105]
    assert tokenize_ids(tok, TokenizeRequest(prompt="ab")) == [1, 97, 98]
    assert tokenize_ids(tok, TokenizeRequest(prompt="ab", add_special_tokens=False)) == [97, 98]
    error = refused(tokenize_ids, tok, TokenizeRequest())
    assert (error.status, error.param) == (400, "prompt")
    assert error.message == "give either 'prompt' or 'messages'"


# --- error bodies --------------------------------------------------------------------------------


def test_error_body_types_follow_the_status():
    assert error_body(404, "gone", "model") == {
        "error": {"message": "gone", "type": "NotFoundError", "param": "model", "code": 404}
    }
    assert error_body(400, "bad", None)["error"]["type"] == "BadRequestError"
    assert error_body(422, "odd", "x")["error"]["type"] == "InvalidRequestError"


def test_validation_errors_name_the_first_field():
    errors = [
        {"loc": ("body", "n"), "msg": "too small"},
        {"loc": ("body", "messages", 0), "msg": "not a dict"},
    ]
    assert validation_error_body(errors) == {
        "error": {
            "message": "n: too small; messages.0: not a dict",
            "type": "BadRequestError",
            "param": "n",
            "code": 400,
        }
    }
    whole_body = [{"loc": ("body",), "msg": "not JSON"}]
    assert validation_error_body(whole_body)["error"]["param"] is None
    assert validation_error_body(whole_body)["error"]["message"] == ": not JSON"


# --- answers -------------------------------------------------------------------------------------


def spell(token: int) -> str:
    return {104: "h", 105: "i", 97: "a", 233: "é"}[token]


def test_token_text_spells_ids_on_request():
    assert token_text(42, True, lambda ids: "never") == "token_id:42"
    assert token_text(104, False, lambda ids: "".join(chr(i) for i in ids)) == "h"


def test_chat_logprobs_carry_bytes_and_alternatives():
    tops = [[(104, -0.5), (97, -2.0)], [(105, -1.0)]]
    assert chat_logprobs([104, 105], [-0.5, -1.0], tops, spell) == {
        "content": [
            {
                "token": "h",
                "logprob": -0.5,
                "bytes": [104],
                "top_logprobs": [
                    {"token": "h", "logprob": -0.5, "bytes": [104]},
                    {"token": "a", "logprob": -2.0, "bytes": [97]},
                ],
            },
            {
                "token": "i",
                "logprob": -1.0,
                "bytes": [105],
                "top_logprobs": [{"token": "i", "logprob": -1.0, "bytes": [105]}],
            },
        ]
    }


def test_chat_logprobs_without_alternatives_and_with_utf8():
    assert chat_logprobs([233], [-0.25], [], spell) == {
        "content": [{"token": "é", "logprob": -0.25, "bytes": [195, 169], "top_logprobs": []}]
    }


def test_chat_logprobs_refuse_misaligned_lists():
    with pytest.raises(ValueError):
        chat_logprobs([104, 105], [-0.5], [], spell)


def test_completion_logprobs_offsets_count_characters():
    words = {1: "ab", 2: "c", 3: "de"}.__getitem__
    tops = [[(1, -0.1), (2, -3.0)], [(2, -0.2)], [(3, -0.3)]]
    assert completion_logprobs([1, 2, 3], [-0.1, -0.2, -0.3], tops, words, True) == {
        "tokens": ["ab", "c", "de"],
        "token_logprobs": [-0.1, -0.2, -0.3],
        "top_logprobs": [{"ab": -0.1, "c": -3.0}, {"c": -0.2}, {"de": -0.3}],
        "text_offset": [0, 2, 3],
    }
    without = completion_logprobs([1, 2, 3], [-0.1, -0.2, -0.3], [], words, False)
    assert without["top_logprobs"] is None and without["text_offset"] == [0, 2, 3]


def test_usage_adds_up():
    assert usage_body(7, 5) == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}


SAMPLES = [
    Sample([104], [-0.5], [], "h", "length"),
    Sample([105, 97], [-1.0, -2.0], [], "ia", "stop"),
]


def test_chat_choices_number_samples_and_add_logprobs_on_request():
    plain = chat_choices(SAMPLES, False, spell)
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in plain] == [
        (0, "h", "length"),
        (1, "ia", "stop"),
    ]
    assert [c["logprobs"] for c in plain] == [None, None]
    with_logprobs = chat_choices(SAMPLES, True, spell)
    assert [t["token"] for t in with_logprobs[1]["logprobs"]["content"]] == ["i", "a"]


def test_text_choices_logprobs_zero_still_returns_token_logprobs():
    assert [c["logprobs"] for c in text_choices(SAMPLES, None, spell)] == [None, None]
    zero = text_choices(SAMPLES, 0, spell)
    assert [c["index"] for c in zero] == [0, 1]
    assert zero[1]["logprobs"] == {
        "tokens": ["i", "a"],
        "token_logprobs": [-1.0, -2.0],
        "top_logprobs": None,
        "text_offset": [0, 1],
    }
