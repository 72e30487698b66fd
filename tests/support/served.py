"""An env handed a client of the trajectory API without the whole serve runtime: the
env reads its client from its runtime (`BaseEnv.client`), so the stand-in runtime holds
just that (and no workers)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


def give_client(env: Any, client: Any) -> Any:
    env._runtime = SimpleNamespace(client=client, workers={})
    return client
