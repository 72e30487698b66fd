"""The one exposure rule every listener shares (atroposlib.utils.exposure)."""

from __future__ import annotations

import pytest

from atroposlib.api import settings as api_settings
from atroposlib.utils.exposure import exposure_problem, is_loopback, key_from_environment


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost"])
def test_loopback_addresses(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.1", "192.168.1.2", "example.org", ""])
def test_everything_else_is_exposed(host):
    assert not is_loopback(host)


def test_the_problem_names_the_host_the_risk_and_both_ways_out():
    problem = exposure_problem("0.0.0.0", None, False, "do harm", "set SOME_KEY")
    assert problem == (
        "refusing to bind 0.0.0.0 without an API key: anyone who can reach it could do harm. "
        "Pass --api-key KEY (or set SOME_KEY), or --insecure to accept the risk."
    )
    assert exposure_problem("0.0.0.0", "k", False, "x", "y") is None
    assert exposure_problem("0.0.0.0", None, True, "x", "y") is None
    assert exposure_problem("127.0.0.1", None, False, "x", "y") is None
    assert exposure_problem("0.0.0.0", "", False, "x", "y") is not None, "an empty key is none"


def test_run_api_uses_the_shared_rule():
    assert api_settings.is_loopback is is_loopback
    problem = api_settings.APISettings(host="0.0.0.0").exposure_problem()
    assert "--insecure" in problem and "ATROPOS_API_KEY" in problem


def test_key_from_environment_takes_the_first_non_empty(monkeypatch):
    monkeypatch.setenv("EXPOSURE_A", "")
    monkeypatch.setenv("EXPOSURE_B", "b")
    monkeypatch.delenv("EXPOSURE_C", raising=False)
    assert key_from_environment(["EXPOSURE_C", "EXPOSURE_A", "EXPOSURE_B"]) == "b"
    assert key_from_environment(["EXPOSURE_C"]) is None


def test_the_launchers_engine_key_goes_only_to_the_engines_it_was_issued_for(monkeypatch):
    """PRX-1 of the security review: a server learnt at run time (the proxy's /setup)
    was sent the run's key. The key is pinned to its engines' origins now."""
    from atroposlib.envs.server_handling.server_baseline import APIServerConfig
    from atroposlib.envs.server_handling.vllm_server import VLLMServer
    from atroposlib.utils.exposure import key_issued_for, url_origin

    def key_sent_to(base_url: str, api_key: str | None = "", inherits: bool = True) -> str:
        server = VLLMServer(APIServerConfig(base_url=base_url, model_name="m", api_key=api_key))
        server.inherits_environment_keys = inherits
        return server.endpoint_key

    monkeypatch.setenv("ATROPOS_ENGINE_API_KEY", "run-key")
    monkeypatch.setenv("OPENAI_API_KEY", "openai-key")
    monkeypatch.delenv("ATROPOS_ENGINE_URLS", raising=False)
    assert key_sent_to("http://gpu-box:9001/v1") == "run-key", "a key exported by hand"
    monkeypatch.setenv("ATROPOS_ENGINE_URLS", "http://127.0.0.1:9001,http://127.0.0.1:9002")
    assert key_sent_to("http://127.0.0.1:9001/v1") == "run-key"
    assert key_sent_to("HTTP://127.0.0.1:9002/v1/") == "run-key"
    assert key_sent_to("http://127.0.0.1:9003/v1") == ""
    assert key_sent_to("http://attacker.example:9001/v1") == ""
    assert key_sent_to("https://127.0.0.1:9001/v1") == "", "another scheme is another origin"
    assert key_sent_to("http://127.0.0.1:9001/v1", inherits=False) == ""
    assert key_sent_to("http://127.0.0.1:9003/v1", api_key="own") == "own", "its own key"
    assert key_sent_to("http://127.0.0.1:9003/v1", api_key=None) == "openai-key", "the SDK's"
    assert key_sent_to("http://127.0.0.1:9003/v1", api_key=None, inherits=False) == ""
    assert url_origin("https://h/v1") == "https://h:443" and url_origin("http://h:x/") == ""
    assert not key_issued_for("http://127.0.0.1:90011/v1")
