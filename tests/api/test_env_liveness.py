"""E5: an env that died without /disconnect-env stops counting once it falls silent."""

from __future__ import annotations

import httpx

from tests.support.groups import make_group, register, register_env, tags_of
from tests.support.inprocess_api import inprocess_api
from tests.support.waiting import wait_until


def weight(client: httpx.Client, env_id: int) -> float:
    return client.get("/status-env", params={"env_id": env_id}).json()["env_weight"]


def test_a_silent_env_stops_diluting_and_stops_holding_batches(tmp_path):
    with inprocess_api(tmp_path / "state", env_timeout_s=1.5) as client:
        register(client)
        client.get("/batch")  # the trainer has started: envs may register
        live = register_env(client, desired_name="live")["env_id"]
        ghost = register_env(client, desired_name="ghost", min_batch_allocation=0.5)["env_id"]
        assert weight(client, live) == 0.5  # both count while the ghost is fresh
        for tag in (1, 2):
            client.post("/scored_data", json=make_group(4, tag=tag, env_id=live))
        assert client.get("/batch").json()["batch"] is None  # the ghost's share holds it
        assert wait_until(lambda: weight(client, live) == 1.0, 10, "the silent env kept its share")
        assert tags_of(client.get("/batch").json()["batch"]) == [1, 2]
        assert weight(client, ghost) == 0.5  # it polls: it counts again, from that poll
        assert weight(client, live) == 0.5
