"""How the server commands start and stop for a person at a terminal.

On a port another process holds: one line naming host:port and what to do, exit code 2,
before any work (no state dir, no model or tokenizer load). On Ctrl-C: one line,
exit code 0, no traceback.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from atroposlib.utils.listen import listen_problem
from tests.support.processes import ApiProcess

pytestmark = pytest.mark.integration


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port a listening socket of this test holds."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def run_tool(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATROPOS_")}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def assert_one_clear_line(done: subprocess.CompletedProcess, tool: str, port: int) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{tool}: cannot listen on 127.0.0.1:{port}: port {port} is in use")
    assert "--port" in lines[0]
    assert "Uvicorn" not in done.stderr + done.stdout


def test_run_api_stops_before_it_creates_its_state_dir(busy_port, tmp_path):
    state = tmp_path / "state"
    done = run_tool("atroposlib.cli.run_api", "--port", str(busy_port), "--state-dir", str(state))
    assert_one_clear_line(done, "run-api", busy_port)
    assert not state.exists()


def test_run_api_with_reload_checks_the_port_too(busy_port, tmp_path):
    state = tmp_path / "state"
    args = ("--port", str(busy_port), "--state-dir", str(state), "--reload")
    done = run_tool("atroposlib.cli.run_api", *args)
    assert_one_clear_line(done, "run-api", busy_port)
    assert not state.exists()


def test_the_inference_server_stops_before_it_loads_the_model(busy_port):
    # a hub name that is nowhere: loading it would fail differently, after seconds
    args = ("--model", "no-such-org/no-such-model", "--port", str(busy_port))
    done = run_tool("atroposlib.cli.inference_server", *args)
    assert_one_clear_line(done, "atropos-inference-server", busy_port)


def test_the_proxy_stops_before_it_loads_the_tokenizer(busy_port, tmp_path):
    config = tmp_path / "servers.json"
    servers = [{"base_url": "http://127.0.0.1:1/v1", "server_type": "vllm"}]
    config.write_text(json.dumps({"model_name": "no-such-org/no-such-model", "servers": servers}))
    args = ("--config", str(config), "--port", str(busy_port))
    done = run_tool("atroposlib.envs.server_handling.proxy_cli", *args)
    assert_one_clear_line(done, "atropos-proxy", busy_port)


@pytest.mark.parametrize(
    ("module", "tool"),
    [("view_run", "view-run"), ("view_run_multimodal", "view-run-multimodal")],
)
def test_view_run_stops_before_it_loads_the_tokenizer(busy_port, tmp_path, module, tool):
    args = ("--port", str(busy_port), "--tokenizer", str(tmp_path / "no-such-tokenizer"))
    done = run_tool(f"atroposlib.cli.{module}", *args)
    assert_one_clear_line(done, tool, busy_port)


def test_an_address_this_machine_lacks_says_which_host_to_pass():
    problem = listen_problem("192.0.2.1", 8000)  # TEST-NET-1: never a local address
    assert problem is not None and problem.startswith("cannot listen on 192.0.2.1:8000: ")
    assert "--host" in problem


def interrupted(proc: subprocess.Popen) -> int:
    """Ctrl-C as a terminal sends it; the exit code."""
    proc.send_signal(signal.SIGINT)
    return proc.wait(30)


def test_ctrl_c_stops_run_api_with_one_line(tmp_path):
    api = ApiProcess(tmp_path / "state").start()
    assert api.proc is not None
    assert interrupted(api.proc) == 0
    log = api.log()
    assert "Traceback" not in log and log.rstrip().endswith("run-api: stopped"), log


# Ctrl-C to view-run and view-run-multimodal: tests/viewer/test_view_run_browser.py, which
# stops its pages that way once the browser tests are done with them.
