"""`uvicorn atroposlib.api.server:app`, upstream's documented way to start the API, in a
real subprocess: it serves with run-api's defaults (durable store in ./.atropos)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import httpx
import pytest

from atroposlib.utils.ports import free_port
from tests.support.groups import make_group, register_env, start_trainer, tags_of
from tests.support.processes import answers_health
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def uvicorn_api(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log_path = tmp_path / "uvicorn.log"
    cmd = [
        sys.executable,
        "-m",
        "uvicorn",
        "atroposlib.api.server:app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def log_text() -> str:
        return log_path.read_text(errors="replace")

    try:
        wait_until(
            lambda: answers_health(url, proc, log_text, "uvicorn"), 30, "uvicorn did not serve"
        )
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def test_uvicorn_server_app_round_trip(uvicorn_api, tmp_path):
    with httpx.Client(base_url=uvicorn_api, timeout=30) as client:
        assert client.get("/health").json()["store"] == "sqlite"
        start_trainer(client, batch_size=4, max_token_len=64)
        env = register_env(client, group_size=2)
        assert env["status"] == "success"
        for tag in (5, 6):
            answer = client.post("/scored_data", json=make_group(2, tag=tag, env_id=0))
            assert answer.json() == {"status": "received"}
        assert tags_of(client.get("/batch").json()["batch"]) == [5, 6]
        assert client.get("/status").json()["current_step"] == 1
    # run-api's default --state-dir, relative to where the server runs
    assert (tmp_path / ".atropos").is_dir()


async def test_status_env_as_upstreams_aiohttp_client_asks(uvicorn_api):
    """Upstream's env sends env_id as a JSON body on a GET; a bad one is a clear 422."""
    with httpx.Client(base_url=uvicorn_api, timeout=30) as client:
        start_trainer(client, batch_size=4, max_token_len=64)
        register_env(client, group_size=2)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{uvicorn_api}/status-env", json={"env_id": 0}) as resp:
            assert resp.status == 200
            status = await resp.json()
        assert status["current_step"] == 0 and status["env_weight"] == pytest.approx(1.0)
        async with session.get(f"{uvicorn_api}/status-env", json={"env": 0}) as resp:
            assert resp.status == 422
            assert "env_id" in await resp.text()
        async with session.get(f"{uvicorn_api}/status-env") as resp:
            assert resp.status == 422
        async with session.get(f"{uvicorn_api}/status-env", json={"env_id": 9}) as resp:
            assert resp.status == 404
            assert "unknown env_id 9" in await resp.text()
