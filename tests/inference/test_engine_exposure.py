"""`atropos-inference-server` on a non-loopback address: refused without a key, guarded with one.

The refusals run the real command and need no model (the check comes before loading);
the started servers serve the tiny model on 0.0.0.0 and are reached on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import pytest

from atroposlib.cli.inference_server import InferenceServerSettings
from atroposlib.envs.server_handling.server_manager import ServerManager
from tests.support.inference_servers import server_config
from tests.support.processes import InferenceProcess

KEY = "engine-s3cret"
KEY_VARIABLES = ("ATROPOS_ENGINE_API_KEY", "VLLM_API_KEY")
GUARDED = [
    ("GET", "/v1/models", None),
    ("GET", "/metrics", None),
    ("GET", "/health_generate", None),
    ("POST", "/tokenize", {"prompt": "hi"}),
    ("POST", "/detokenize", {"tokens": [1, 2]}),
    ("POST", "/generate", {"prompt": "hi", "max_tokens": 1}),
    ("POST", "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1}),
]


@pytest.fixture(autouse=True)
def no_key_in_environment(monkeypatch):
    for name in KEY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def run_server(*args: str) -> tuple[int, str, set[str]]:
    """The exit code, stderr, and the modules imported (`python -X importtime`)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "atroposlib.cli.inference_server", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    timed = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    said = "\n".join(line for line in done.stderr.splitlines() if line not in timed)
    return done.returncode, said, {line.rpartition("|")[2].strip() for line in timed}


@pytest.mark.integration
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3"])
def test_non_loopback_without_a_key_is_refused(tmp_path, host):
    code, said, imported = run_server("--model", str(tmp_path / "no-model"), "--host", host)
    assert code == 2, said
    assert f"refusing to bind {host} without an API key" in said
    assert "--insecure" in said and "--api-key" in said
    assert "Traceback" not in said
    assert "torch" not in imported, "the refusal waited for torch's import (seconds of CPU)"


def test_the_key_can_come_from_vllms_variable(monkeypatch):
    settings = InferenceServerSettings(model="m", host="0.0.0.0")
    assert settings.resolved().exposure_problem() is not None
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    assert settings.resolved().api_key == KEY
    assert settings.resolved().exposure_problem() is None
    monkeypatch.setenv("ATROPOS_ENGINE_API_KEY", "ours")
    assert settings.resolved().api_key == "ours", "atroposlib's own variable wins"
    flagged = InferenceServerSettings(model="m", host="0.0.0.0", api_key="flag")
    assert flagged.resolved().api_key == "flag", "--api-key wins over both"


def test_loopback_needs_nothing():
    assert InferenceServerSettings(model="m").exposure_problem() is None
    assert InferenceServerSettings(model="m").host == "127.0.0.1"


def test_insecure_starts_open_on_every_interface_and_says_so():
    # The keyless server's routes answer in every other test; what --insecure changes is
    # the start-up decision on a non-loopback host, and the line it prints.
    settings = InferenceServerSettings(model="m", host="0.0.0.0", insecure=True).resolved()
    assert settings.exposure_problem() is None
    assert settings.api_key is None
    warning = settings.exposure_warning() or ""
    assert "serving 0.0.0.0 with --insecure and no API key" in warning
    assert InferenceServerSettings(model="m").exposure_warning() is None


def test_a_key_guards_every_route_but_health(tiny_model_path, tmp_path):
    server = InferenceProcess(
        tiny_model_path, tmp_path, "tiny", "--host", "0.0.0.0", "--api-key", KEY
    )
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            assert client.get("/health").status_code == 200
            for method, path, body in GUARDED:
                refused = client.request(method, path, json=body)
                assert refused.status_code == 401, (path, refused.text)
                assert refused.json()["error"]["code"] == 401
                wrong = client.request(
                    method, path, json=body, headers={"Authorization": "Bearer nope"}
                )
                assert wrong.status_code == 401, path
            allowed = client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
            assert allowed.status_code == 200
            assert [m["id"] for m in allowed.json()["data"]] == ["tiny"]
        assert_clients_work_with_the_same_key(server.url)
    finally:
        server.stop()


def assert_clients_work_with_the_same_key(url: str) -> None:
    """An env's `api_key` reaches both the OpenAI routes (the SDK) and vLLM's /generate."""
    messages = [{"role": "user", "content": "What is 2 + 5 mod 10?"}]
    keyed = ServerManager([server_config(url, api_key=KEY)])
    answer = asyncio.run(keyed.chat_completion(messages=messages, max_tokens=2, n=1))
    assert len(answer.choices) == 1
    logprobs = asyncio.run(keyed.get_logprobs(input_ids=[5, 17, 42], top_k=1, max_tokens=1))
    assert logprobs["prompt_tokens"] == [5, 17, 42]
    unkeyed = ServerManager([server_config(url, api_key="wrong", timeout=10)])
    with pytest.raises(Exception) as refused:
        asyncio.run(unkeyed.chat_completion(messages=messages, max_tokens=2, n=1))
    assert "401" in str(refused.value) or "auth" in type(refused.value).__name__.lower()
