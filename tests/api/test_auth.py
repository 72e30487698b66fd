"""Bearer-token auth and the refusal to expose an unauthenticated server."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from atroposlib.api.settings import APISettings, is_loopback
from atroposlib.utils.ports import free_port
from tests.support.groups import REGISTRATION, make_group
from tests.support.processes import ApiProcess

KEY = "s3cret-key"


def test_key_guards_every_endpoint_but_root_and_health(api_factory):
    api = api_factory("--api-key", KEY)
    with httpx.Client(base_url=api.url) as anonymous:
        assert anonymous.get("/").status_code == 200
        assert anonymous.get("/health").status_code == 200
        for method, path in [
            ("GET", "/status"),
            ("GET", "/batch"),
            ("GET", "/reset_data"),
            ("POST", "/scored_data"),
            ("GET", "/metrics"),
            ("POST", "/register"),
        ]:
            response = anonymous.request(method, path)
            assert response.status_code == 401, path
            assert "Bearer" in response.json()["detail"]
            assert response.headers["www-authenticate"] == "Bearer"
        wrong = anonymous.get("/status", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
    with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {KEY}"}) as trainer:
        assert trainer.post("/register", json=REGISTRATION).status_code == 200
        assert trainer.post("/scored_data", json=make_group(4)).status_code == 200
        assert trainer.get("/status").status_code == 200


def test_reset_without_key_cannot_wipe_the_run(api_factory):
    api = api_factory("--api-key", KEY)
    auth = {"Authorization": f"Bearer {KEY}"}
    httpx.post(f"{api.url}/register", json=REGISTRATION, headers=auth)
    httpx.post(f"{api.url}/scored_data", json=make_group(4), headers=auth)
    assert httpx.get(f"{api.url}/reset_data").status_code == 401
    assert httpx.post(f"{api.url}/reset_data").status_code == 401
    # API-4: on an API with a key, only POST wipes the run, never a GET (the form an
    # image or a link on any web page makes a browser send)
    by_get = httpx.get(f"{api.url}/reset_data", headers=auth)
    assert by_get.status_code == 403 and "POST it" in by_get.json()["detail"]
    assert httpx.get(f"{api.url}/info", headers=auth).json()["batch_size"] == 8
    assert httpx.post(f"{api.url}/reset_data", json={}, headers=auth).status_code == 200
    assert httpx.get(f"{api.url}/info", headers=auth).json()["batch_size"] == -1


@pytest.mark.integration
def test_key_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ATROPOS_API_KEY", KEY)
    api = ApiProcess(tmp_path / "state").start()
    try:
        assert httpx.get(f"{api.url}/status").status_code == 401
        assert (
            httpx.get(f"{api.url}/status", headers={"Authorization": f"Bearer {KEY}"}).status_code
            == 200
        )
    finally:
        api.stop()


@pytest.mark.integration
def test_public_bind_without_key_refuses_to_start(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ATROPOS_API_KEY"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "atroposlib.cli.run_api",
            "--host",
            "0.0.0.0",
            "--port",
            str(free_port()),
            "--state-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert result.returncode == 2
    assert "--api-key" in result.stderr and "--insecure" in result.stderr


def test_exposure_rules():
    assert APISettings(host="0.0.0.0").exposure_problem() is not None
    assert APISettings(host="0.0.0.0", api_key="k").exposure_problem() is None
    assert APISettings(host="0.0.0.0", insecure=True).exposure_problem() is None
    assert APISettings(host="127.0.0.1").exposure_problem() is None
    assert is_loopback("localhost") and is_loopback("::1") and is_loopback("127.0.0.2")
    assert not is_loopback("10.0.0.1") and not is_loopback("example.org")


def test_insecure_is_said_out_loud():
    """MISC of the correctness review: --insecure started without a word."""
    warning = APISettings(host="0.0.0.0", insecure=True).exposure_warning()
    assert warning.startswith("WARNING: serving 0.0.0.0 with --insecure and no API key")
    assert APISettings(host="0.0.0.0", insecure=True, api_key="k").exposure_warning() is None
    assert APISettings(host="127.0.0.1", insecure=True).exposure_warning() is None


def test_the_environments_key_opens_only_what_an_environment_calls(tmp_path):
    """Keys by role (issue 46): atropos-launch gave every environment the run's key, so
    any environment's process, or whoever stole its key (PRX-1), could take batches or
    wipe the run. The environments' key opens their routes and nothing else."""
    from tests.support.groups import start_trainer
    from tests.support.inprocess_api import inprocess_api

    admin = {"Authorization": "Bearer run-key"}
    env = {"Authorization": "Bearer env-key"}
    with inprocess_api(tmp_path / "state", api_key="run-key", env_api_key="env-key") as c:
        c.headers.update(admin)  # the trainer: registered, and its first /batch asked
        start_trainer(c, batch_size=4)
        del c.headers["Authorization"]
        registration = {"max_token_length": 64, "desired_name": "env", "group_size": 2}
        env_id = c.post("/register-env", json=registration, headers=env).json()["env_id"]
        assert c.post("/scored_data", json=make_group(2), headers=env).status_code == 200
        assert c.get(f"/status-env?env_id={env_id}", headers=env).status_code == 200
        assert c.get("/info", headers=env).status_code == 200
        for method, path in [
            ("GET", "/batch"),
            ("POST", "/reset_data"),
            ("POST", "/register"),
            ("GET", "/status"),
            ("GET", "/latest_example"),
            ("GET", "/metrics"),
        ]:
            refused = c.request(method, path, headers=env, json={} if method == "POST" else None)
            assert refused.status_code == 401, (path, refused.text)
        assert c.get("/status", headers=admin).json()["queue_size"] == 1, "nothing taken"
    with inprocess_api(tmp_path / "plain", api_key="run-key") as c:  # no env key: none
        assert c.get("/info", headers=env).status_code == 401
