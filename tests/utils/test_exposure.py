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
