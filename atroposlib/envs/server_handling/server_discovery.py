"""Where a `ServerManager`'s servers come from.

A list of `APIServerConfig` (one client each), a single `APIServerConfig`
(exactly that server; upstream ignores its base_url and uses the local ports),
a `ServerBaseline` (local servers on ports 9004-9007), or the nodes of a SLURM
job. SLURM's environment is read as integers here (upstream divides by the
string `INFER_TP`), and the client class follows each config's `server_type`.
"""

from __future__ import annotations

import inspect
import os
import subprocess
from collections.abc import Callable, Mapping

from atroposlib.envs.server_handling.openai_server import OpenAIServer
from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    ReasoningConfig,
    ServerBaseline,
)
from atroposlib.envs.server_handling.sglang_server import SGLangServer
from atroposlib.envs.server_handling.trl_vllm_server import TrlVllmServer
from atroposlib.envs.server_handling.vllm_server import VLLMServer

DEFAULT_LOCAL_PORTS = range(9004, 9008)

SERVER_CLASSES: dict[str, type[APIServer]] = {
    "openai": OpenAIServer,
    "vllm": VLLMServer,
    "sglang": SGLangServer,
    "trl": TrlVllmServer,
}


def _hostnames(nodelist: str) -> list[str]:
    result = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True
    )
    return result.stdout.split()


def slurm_server_configs(
    template: ServerBaseline,
    environ: Mapping[str, str] | None = None,
    hostnames: Callable[[str], list[str]] = _hostnames,
) -> list[APIServerConfig] | None:
    """Inference servers of a SLURM job, or None to fall back to the other cases.

    The first NUM_TRAINING_NODES nodes train; every other node serves on ports
    9000 .. 9000 + 8 // INFER_TP - 1.
    """
    values = os.environ if environ is None else environ
    nodelist = values.get("SLURM_JOB_NODELIST")
    if not nodelist:
        return None
    nodes = hostnames(nodelist)
    if len(nodes) < 2:
        return None
    training = int(values.get("NUM_TRAINING_NODES", "1"))
    per_node = 8 // int(values.get("INFER_TP", "1"))
    base = template.model_dump()
    return [
        APIServerConfig(**{**base, "base_url": f"http://{node}:{port}/v1"})
        for node in nodes[training:]
        for port in range(9000, 9000 + per_node)
    ]


def resolve_server_configs(
    configs: ServerBaseline | APIServerConfig | list[APIServerConfig], slurm: bool = False
) -> list[APIServerConfig]:
    if isinstance(configs, list):
        if not configs:
            raise ValueError("no inference servers configured")
        if slurm:
            return slurm_server_configs(configs[0]) or list(configs)
        return list(configs)
    if isinstance(configs, APIServerConfig):
        if slurm:
            return slurm_server_configs(configs) or [configs]
        return [configs]
    if slurm or os.environ.get("SLURM_JOB_NODELIST"):
        found = slurm_server_configs(configs)
        if found:
            return found
    base = configs.model_dump()
    return [
        APIServerConfig(**{**base, "base_url": f"http://localhost:{port}/v1", "api_key": "x"})
        for port in DEFAULT_LOCAL_PORTS
    ]


def server_for(
    config: APIServerConfig,
    reasoning: ReasoningConfig | None = None,
    server_class: type[APIServer] | None = None,
) -> APIServer:
    """The client for `config`: `server_class` when it is a concrete class, else the
    one its `server_type` names (upstream passes the abstract APIServer to mean that)."""
    if server_class is not None and not inspect.isabstract(server_class):
        return server_class(config, reasoning_config=reasoning)
    cls = SERVER_CLASSES.get(config.server_type)
    if cls is None:
        raise ValueError(
            f"Invalid server type: {config.server_type!r}; supported: {sorted(SERVER_CLASSES)}"
        )
    return cls(config, reasoning_config=reasoning)
