"""A failed rollout's report: context refusals recognised and logged once, other errors
once per place they were raised, every failure counted."""

from __future__ import annotations

import logging
import time
from collections import Counter
from types import SimpleNamespace

import httpx
import openai
import pytest

from atroposlib.envs.rollout_failures import (
    STUCK_REFUSALS,
    RolloutFailures,
    context_refusal,
)

# Refusals in the words of the servers an env may talk to (the numbers are made up).
REFUSALS = {
    "ours, max_tokens": (
        "max_tokens 1024 + prompt 342 tokens exceeds the maximum context length 512",
        (342, 1024, 512),
    ),
    "ours, prompt": (
        "prompt has 856 tokens; this model's maximum context length is 512",
        (856, None, 512),
    ),
    "vllm, max_tokens": (
        "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum "
        "context length is 4096 tokens and your request has 2778 input tokens "
        "(8000 > 4096 - 2778).",
        (2778, 8000, 4096),
    ),
    "vllm, older": (
        "This model's maximum context length is 4096 tokens. However, you requested 5000 "
        "tokens (1000 in the messages, 4000 in the completion). Please reduce the length of "
        "the messages or completion.",
        (1000, 4000, 4096),
    ),
    "vllm, prompt": (
        "This model's maximum context length is 1536 tokens. However, your request has 4176 "
        "input tokens. Please reduce the length of the input messages.",
        (4176, None, 1536),
    ),
    "vllm, decoder prompt": (
        "The decoder prompt (length 5000) is longer than the maximum model length of 4096. "
        "Make sure that `max_model_len` is no smaller than the number of text tokens.",
        (5000, None, 4096),
    ),
    "sglang": (
        "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
        (5000, None, 4096),
    ),
    "llama.cpp": (
        "request (4476 tokens) exceeds the available context size (4096 tokens)",
        (4476, None, 4096),
    ),
    "openai": (
        "This model's maximum context length is 8192 tokens. However, your messages resulted "
        "in 9000 tokens. Please reduce the length of the messages.",
        (9000, None, 8192),
    ),
}

NOT_REFUSALS = [
    "The model `gpt-x` does not exist.",
    "Connection refused",
    "token ids must be in [0, 512)",
    "max_tokens: Input should be greater than or equal to 1",
    "KeyError: 'context'",
]


def bad_request(message: str) -> openai.BadRequestError:
    """The error the openai client raises for the server's 400, as a rollout sees it."""
    response = httpx.Response(
        400,
        json={"error": {"message": message}},
        request=httpx.Request("POST", "http://127.0.0.1:9001/v1/completions"),
    )
    return openai.BadRequestError(f"Error code: 400 - {message}", response=response, body=None)


@pytest.mark.parametrize("words", REFUSALS, ids=list(REFUSALS))
def test_each_servers_context_refusal_is_recognised_with_its_numbers(words):
    message, (prompt, asked, context) = REFUSALS[words]
    refusal = context_refusal(bad_request(message))
    assert refusal is not None
    assert (refusal.prompt_tokens, refusal.max_tokens, refusal.context) == (prompt, asked, context)
    assert refusal.message == message


@pytest.mark.parametrize("message", NOT_REFUSALS)
def test_other_errors_are_not_context_refusals(message):
    assert context_refusal(bad_request(message)) is None
    assert context_refusal(RuntimeError(message)) is None


def test_a_refusal_wrapped_in_another_error_is_still_found():
    try:
        try:
            raise bad_request(REFUSALS["ours, prompt"][0])
        except openai.BadRequestError as error:
            raise RuntimeError("the judge did not answer") from error
    except RuntimeError as wrapped:
        refusal = context_refusal(wrapped)
    assert refusal is not None and refusal.prompt_tokens == 856


def config(**fields):
    return SimpleNamespace(**{"max_tokens": 1024, "max_token_length": 2048, **fields})


@pytest.mark.parametrize(
    ("message", "env_config", "advice"),
    [
        # the env asked for its own max_tokens: lower it to what fits
        (REFUSALS["ours, max_tokens"][0], config(), "lower --env.max_tokens to 170 or less, or"),
        # a multi-turn env cut its reply to its token budget: the budget is too big
        (
            "max_tokens 300 + prompt 3900 tokens exceeds the maximum context length 4096",
            config(max_tokens=512, max_token_length=8192),
            "lower --env.max_token_length to 4096 or less, or",
        ),
        # a request the env does not size (a judge's verdict): only a longer context helps
        (
            "max_tokens 512 + prompt 276 tokens exceeds the maximum context length 512",
            config(max_tokens=64),
            "does not fit the model's context of 512 tokens; use a model with a longer context",
        ),
        (REFUSALS["ours, prompt"][0], config(), "this env needs a model with a longer context"),
        (
            "the request exceeds the context window",
            config(),
            "refused a request for its context length (the request exceeds the context window)",
        ),
    ],
    ids=["max_tokens", "token_budget", "judge", "prompt", "unparsed"],
)
def test_the_line_says_what_to_change(message, env_config, advice):
    refusal = context_refusal(RuntimeError(message))
    assert refusal is not None
    line = refusal.line("gsm8k", env_config)
    assert line.startswith("gsm8k: ") and advice in line
    assert "\n" not in line


def fake_env() -> SimpleNamespace:
    return SimpleNamespace(name="gsm8k", stats=Counter(), config=config())


def fail(error: Exception) -> Exception:
    """`error` raised and caught, so it carries the traceback of this place."""
    try:
        raise error
    except Exception as caught:
        return caught


def fail_elsewhere(error: Exception) -> Exception:
    try:
        raise error
    except Exception as caught:
        return caught


def test_refusals_are_one_line_per_env_and_all_counted(caplog):
    env = fake_env()
    failures = RolloutFailures(env)
    with caplog.at_level(logging.DEBUG, logger="atroposlib.envs"):
        for n in range(40):
            failures.record({"n": n}, fail(bad_request(REFUSALS["ours, max_tokens"][0])))
    shown = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert len(shown) == 1 and shown[0].exc_info is None
    assert shown[0].getMessage() == (
        "gsm8k: a prompt of 342 tokens plus max_tokens 1024 does not fit the model's context of "
        "512 tokens; lower --env.max_tokens to 170 or less, or use a model with a longer "
        "context; later refusals are counted (context_refusals), not logged"
    )
    assert len(caplog.records) == 40  # the 39 others at DEBUG, one line each
    assert env.stats == Counter(rollout_errors=40, context_refusals=40)
    assert failures.summary() == "40 failed, 40 of them refused for the model's context length"


def test_other_errors_get_one_traceback_per_place_raised(caplog):
    env = fake_env()
    failures = RolloutFailures(env)
    with caplog.at_level(logging.INFO, logger="atroposlib.envs"):
        for n in range(3):
            failures.record({"n": n}, fail(KeyError(f"answer {n}")))
            failures.record({"n": n}, fail_elsewhere(KeyError(f"answer {n}")))
            failures.record({"n": n}, fail(ValueError("bad row")))
    tracebacks = [r for r in caplog.records if r.exc_info]
    raised = [type(r.exc_info[1]).__name__ for r in tracebacks]
    assert raised == ["KeyError", "KeyError", "ValueError"]
    assert [r.getMessage() for r in tracebacks] == ["rollout of item {'n': 0} failed"] * 3
    assert len(caplog.records) == 3
    assert env.stats == Counter(rollout_errors=9)
    assert failures.summary() == "9 failed"


def test_an_env_whose_every_rollout_is_refused_for_a_while_says_to_stop():
    env = fake_env()
    env.config.stop_when_refused_s = STUCK_S = 60.0
    failures = RolloutFailures(env)
    refused = REFUSALS["ours, max_tokens"][0]
    for n in range(STUCK_REFUSALS - 1):
        failures.record({"n": n}, fail(bad_request(refused)))
    later = time.monotonic() + STUCK_S
    assert failures.every_rollout_refused(kept=0, now=later) is None  # not enough of them yet
    failures.record({"n": 99}, fail(bad_request(refused)))
    assert failures.every_rollout_refused(kept=0, now=later - STUCK_S / 2) is None  # too soon
    assert failures.every_rollout_refused(kept=1, now=later) is None  # one fitted
    stop = failures.every_rollout_refused(kept=0, now=later)
    assert stop is not None and stop.startswith("gsm8k: a prompt of 342 tokens plus max_tokens")
    assert f"all {STUCK_REFUSALS} rollouts in " in stop and stop.endswith("so this env stops")
    env.config.stop_when_refused_s = 0  # never
    assert failures.every_rollout_refused(kept=0, now=later) is None
    env.config.stop_when_refused_s = STUCK_S
    failures.record({"n": 100}, fail(KeyError("answer")))  # another failure: not a setting
    assert failures.every_rollout_refused(kept=0, now=later) is None
