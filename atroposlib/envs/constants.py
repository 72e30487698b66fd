"""Namespaces of an environment's command-line flags and config file sections.

Upstream environments build flag names from these (``f"{OPENAI_NAMESPACE}{NAMESPACE_SEP}..."``)
when they override config handling, so the values must stay exactly as Atropos spells them.
"""

__all__ = ["ENV_NAMESPACE", "NAMESPACE_SEP", "OPENAI_NAMESPACE", "SERVER_MANAGER_NAMESPACE"]

ENV_NAMESPACE = "env"
OPENAI_NAMESPACE = "openai"
SERVER_MANAGER_NAMESPACE = "server"
NAMESPACE_SEP = "."  # joins a namespace and a field: env.group_size, openai.base_url
