"""`atropos-proxy` (also `python -m atroposlib.envs.server_handling.managed_server_proxy`):
the ManagedServer OpenAI proxy as a standalone server.

    atropos-proxy --config servers.json --port 9100

`servers.json` is upstream's: `{"model_name": ..., "tokenizer_name"?: ...,
"servers": [{"base_url": "http://127.0.0.1:9001/v1", "server_type": "vllm"}, ...]}`.
A server without `api_key` is sent the engine key from the environment
(ATROPOS_ENGINE_API_KEY, else VLLM_API_KEY), as environments do, if it is one the key
was issued for (ATROPOS_ENGINE_URLS); servers set later by POST /setup get only the
keys their body names. The proxy binds
loopback; another address needs --api-key (or $ATROPOS_PROXY_API_KEY) or
--insecure, as every listener here (atroposlib.utils.exposure).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from atroposlib.envs.server_handling.proxy_sessions import SessionLimits
from atroposlib.utils.exposure import (
    ENGINE_KEY_ENVIRONMENT,
    ExposureRule,
    key_from_environment,
    key_issued_for,
)
from atroposlib.utils.flags import add_model_flags, parse_settings
from atroposlib.utils.listen import ListenError, listen_socket, serve
from atroposlib.utils.logging import configure_logging
from atroposlib.utils.request_guard import ALLOWED_HOSTS_HELP, HostNames
from atroposlib.utils.tokenizers import TokenizerLoadError, load_tokenizer

PROXY_KEY_ENVIRONMENT = ("ATROPOS_PROXY_API_KEY",)
DEFAULT_PORT = 9100


class ProxySettings(ExposureRule, SessionLimits):
    KEY_ENVIRONMENT: ClassVar[tuple[str, ...]] = PROXY_KEY_ENVIRONMENT
    EXPOSURE_RISK: ClassVar[str] = (
        "generate with the backends through it and read every session's tokens"
    )

    config: Path = Field(..., description="JSON file naming the model and its backends.")
    host: str = Field(
        "127.0.0.1", description="Address to bind. Non-loopback needs --api-key or --insecure."
    )
    port: int = Field(DEFAULT_PORT, ge=0, le=65535, description="TCP port.")
    api_key: str | None = Field(
        None,
        description="Require 'Authorization: Bearer <key>' on every route but /health "
        "(default: $ATROPOS_PROXY_API_KEY); each session then gets a key of its own for "
        "its completions.",
    )
    insecure: bool = Field(
        False, description="Allow binding a non-loopback address without an API key."
    )
    allowed_hosts: HostNames = Field(default_factory=list, description=ALLOWED_HOSTS_HELP)
    log_level: str = Field("info", description="Logging level.")


def load_proxy_config(path: Path) -> dict:
    """The config JSON, checked for what the proxy needs; ValueError says what is wrong."""
    try:
        config = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(config, dict) or not isinstance(config.get("model_name"), str):
        raise ValueError(f'{path} needs a "model_name" string')
    servers = config.get("servers")
    if not isinstance(servers, list) or not servers:
        raise ValueError(f'{path} needs a non-empty "servers" list')
    for index, server in enumerate(servers):
        if not isinstance(server, dict) or not isinstance(server.get("base_url"), str):
            raise ValueError(f'{path}: servers[{index}] needs a "base_url" string')
    engine_key = key_from_environment(ENGINE_KEY_ENVIRONMENT)
    for server in servers:
        if engine_key and not server.get("api_key") and key_issued_for(server["base_url"]):
            server["api_key"] = engine_key
    return config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="atropos-proxy", description="OpenAI-compatible proxy over ManagedServer."
    )
    add_model_flags(parser, ProxySettings)
    settings, _ = parse_settings(parser, ProxySettings, argv)
    settings = settings.resolved()
    if warning := settings.exposure_warning():
        print(f"atropos-proxy: {warning}", file=sys.stderr)
    if problem := settings.exposure_problem():
        print(f"atropos-proxy: {problem}", file=sys.stderr)
        return 2
    try:
        config = load_proxy_config(settings.config)
    except ValueError as exc:
        print(f"atropos-proxy: {exc}", file=sys.stderr)
        return 2
    try:  # before the tokenizer loads, so a busy port costs no time
        sock = listen_socket(settings.host, settings.port)
    except ListenError as error:
        print(f"atropos-proxy: {error}", file=sys.stderr)
        return 2
    with sock:
        return _serve(settings, config, sock)


def _serve(settings: ProxySettings, config: dict, sock: socket.socket) -> int:
    """Load the tokenizer and the backends, then serve on the socket bound for them."""
    configure_logging(settings.log_level)
    from atroposlib.envs.server_handling.managed_server_proxy import (
        create_app,
        servers_from_config,
    )
    from atroposlib.envs.server_handling.server_manager import ServerManager

    model_name = config["model_name"]
    try:
        tokenizer = load_tokenizer(config.get("tokenizer_name", model_name), "--config")
    except TokenizerLoadError as exc:
        print(f"atropos-proxy: cannot load the tokenizer: {exc}", file=sys.stderr)
        return 1
    manager = ServerManager(configs=servers_from_config(config))
    limits = SessionLimits(**settings.model_dump(include=set(SessionLimits.model_fields)))
    hosts = frozenset(name.lower() for name in settings.allowed_hosts)
    app = create_app(manager, tokenizer, model_name, limits, settings.api_key, hosts)
    backends = ", ".join(str(c.config.base_url) for c in manager.servers)
    print(
        f"atropos-proxy: {model_name} over {backends} on http://{settings.host}:{settings.port}",
        file=sys.stderr,
    )
    return serve(
        app, sock, "atropos-proxy", host=settings.host, port=settings.port, access_log=False
    )


if __name__ == "__main__":
    sys.exit(main())
