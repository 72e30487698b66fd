"""An `atropos-proxy` subprocess (upstream's `python -m` form) over given backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from atroposlib.utils.ports import free_port
from tests.support.processes import answers_health
from tests.support.waiting import wait_until

PROXY_MODULE = "atroposlib.envs.server_handling.managed_server_proxy"


def proxy_config(model_path: Path, *backend_urls: str) -> dict:
    """Upstream's servers.json for `backend_urls` (engine roots, without /v1)."""
    return {
        "model_name": "tiny",
        "tokenizer_name": str(model_path),
        "servers": [{"base_url": f"{url}/v1", "server_type": "vllm"} for url in backend_urls],
    }


class ProxyProcess:
    def __init__(
        self, config: dict, log_dir: Path, *extra: str, env: dict[str, str] | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config_path = log_dir / f"proxy-{self.port}.json"
        config_path.write_text(json.dumps(config))
        self.log_path = log_dir / f"proxy-{self.port}.log"
        command = [sys.executable, "-m", PROXY_MODULE, "--config", str(config_path)]
        command += ["--port", str(self.port), *extra]
        self.proc = subprocess.Popen(
            command,
            stdout=open(self.log_path, "wb"),
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        try:
            wait_until(
                lambda: answers_health(self.url, self.proc, self.log, "proxy"),
                60,
                "proxy not healthy",
            )
        except (AssertionError, RuntimeError) as failure:
            self.stop()
            raise AssertionError(f"{failure}:\n{self.log()}") from None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
