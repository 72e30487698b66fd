"""`atropos-proxy`: the ManagedServer OpenAI proxy (envs/server_handling/proxy_cli.py)."""

from atroposlib.envs.server_handling.proxy_cli import main

__all__ = ["main"]
