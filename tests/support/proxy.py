"""An `atropos-proxy` subprocess (upstream's `python -m` form) over given backends."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from atroposlib.utils.ports import free_port
from tests.support.processes import ServerProcess

PROXY_MODULE = "atroposlib.envs.server_handling.managed_server_proxy"


def proxy_config(model_path: Path, *backend_urls: str) -> dict:
    """Upstream's servers.json for `backend_urls` (engine roots, without /v1)."""
    return {
        "model_name": "tiny",
        "tokenizer_name": str(model_path),
        "servers": [{"base_url": f"{url}/v1", "server_type": "vllm"} for url in backend_urls],
    }


class ProxyProcess(ServerProcess):
    def __init__(
        self, config: dict, log_dir: Path, *extra: str, env: dict[str, str] | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config_path = log_dir / f"proxy-{self.port}.json"
        config_path.write_text(json.dumps(config))
        self.log_path = log_dir / f"proxy-{self.port}.log"
        command = [sys.executable, "-m", PROXY_MODULE, "--config", str(config_path)]
        self.start(
            [*command, "--port", str(self.port), *extra], "proxy", 60, {**os.environ, **(env or {})}
        )
