"""The one rule every atroposlib listener follows before it binds a socket.

Loopback is private to this machine; any other address is open to whoever can reach
it. So a listener binds 127.0.0.1 by default and refuses a non-loopback address unless
it has a token to check or the user passed `--insecure`. `run-api`, the inference
server and the viewers all call `exposure_problem`, so the rule and its message are
the same everywhere (docs/security.md).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable
from typing import Any, ClassVar

INSECURE_FLAG = "--insecure"
API_KEY_ENVIRONMENT = "ATROPOS_API_KEY"
"""run-api's key: run-api, environments, trainers and viewers read it."""
ENV_KEY_ENVIRONMENT = "ATROPOS_ENV_API_KEY"
"""A second run-api key, which opens only what an environment calls (ENVIRONMENT_PATHS
in atroposlib/api/routes.py): atropos-launch gives it to the environments as their
ATROPOS_API_KEY, so an environment's process cannot take batches or wipe the run."""
ENGINE_KEY_ENVIRONMENT = ("ATROPOS_ENGINE_API_KEY", "VLLM_API_KEY")
"""An engine's key, first set wins: our engine reads both, vLLM the second; an
environment sends the first to its engine (how atropos-launch hands it over)."""
ENGINE_URLS_ENVIRONMENT = "ATROPOS_ENGINE_URLS"
"""The engines (`scheme://host:port`, comma-separated) that $ATROPOS_ENGINE_API_KEY was
issued for: atropos-launch sets both, and an environment then sends the key to those
servers only, never to a `base_url` it learns later (PRX-1 of the security review)."""


def url_origin(url: str) -> str:
    """`scheme://host:port` of `url`, lowercased, the port written out."""
    from urllib.parse import urlsplit

    parts = urlsplit(url.strip())
    scheme = (parts.scheme or "http").lower()
    host = (parts.hostname or "").lower()
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:  # a port that is not a number names no engine
        return ""
    return f"{scheme}://{host}:{port}"


def key_issued_for(url: str) -> bool:
    """Whether the launcher's engine key may go to `url`: always when no launcher pinned
    it (a key the user exported by hand), else only to the engines it named."""
    pinned = os.environ.get(ENGINE_URLS_ENVIRONMENT)
    if pinned is None:
        return True
    origin = url_origin(url)
    return bool(origin) and origin in {url_origin(u) for u in pinned.split(",")}


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_problem(
    host: str, api_key: str | None, insecure: bool, risk: str, key_source: str
) -> str | None:
    """Why binding `host` must not happen, or None when it is safe or explicitly allowed.

    `risk` completes "anyone who can reach it could ..."; `key_source` says where the
    key can come from besides `--api-key` (e.g. "set ATROPOS_API_KEY").
    """
    if api_key or insecure or is_loopback(host):
        return None
    return (
        f"refusing to bind {host} without an API key: anyone who can reach it could {risk}. "
        f"Pass --api-key KEY (or {key_source}), or {INSECURE_FLAG} to accept the risk."
    )


def engine_args_problem(args: list[str]) -> str | None:
    """Why extra engine flags must not be used, or None.

    The engine binds loopback, and its weight routes (vLLM's development routes
    included) trust whoever reaches it, so a `--host` to any other address is refused.
    A key in argv is readable by every local user (/proc/*/cmdline), so `--api-key` is
    refused too: the key belongs in the environment.
    """
    for index, arg in enumerate(args):
        name, _, inline = arg.partition("=")
        value = inline or (args[index + 1] if index + 1 < len(args) else "")
        if name == "--host" and not is_loopback(value):
            return (
                f"engine flag --host {value}: the engine must bind loopback, since its weight "
                "routes would be open to the network; run an exposed engine yourself, with a key"
            )
        if name == "--api-key":
            return (
                "engine flag --api-key: a key in argv is readable by every local user; set "
                "ATROPOS_ENGINE_API_KEY or VLLM_API_KEY in the environment instead"
            )
    return None


def key_from_environment(names: Iterable[str]) -> str | None:
    """The first non-empty environment variable of `names`, or None."""
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


class ExposureRule:
    """Mixed into a listener's pydantic settings (fields `host`, `api_key`, `insecure`):
    the key from the environment and the rule, named once for every listener."""

    KEY_ENVIRONMENT: ClassVar[tuple[str, ...]]
    """Environment variables the key may come from, first set wins."""
    EXPOSURE_RISK: ClassVar[str]
    """What anyone who can reach the listener could do ("anyone ... could <this>")."""

    def resolved(self: Any) -> Any:
        """Fill the key from the environment when --api-key was not given."""
        if self.api_key is None:
            key = key_from_environment(self.KEY_ENVIRONMENT)
            if key:
                return self.model_copy(update={"api_key": key})
        return self

    def exposure_problem(self: Any) -> str | None:
        """Why this configuration must not start, or None."""
        return exposure_problem(
            self.host,
            self.api_key,
            self.insecure,
            risk=self.EXPOSURE_RISK,
            key_source="set " + " or ".join(self.KEY_ENVIRONMENT),
        )

    def exposure_warning(self: Any) -> str | None:
        """What --insecure allowed, to say at start-up (it used to start without a word)."""
        if self.insecure and not self.api_key and not is_loopback(self.host):
            return (
                f"WARNING: serving {self.host} with {INSECURE_FLAG} and no API key: anyone "
                f"who can reach it could {self.EXPOSURE_RISK}"
            )
        return None
