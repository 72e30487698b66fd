"""The viewer's pulling against a real run-api: tokens, refusals, waiting, no wiping."""

from __future__ import annotations

import httpx
import pytest

from atroposlib.utils.ports import free_port
from atroposlib.viewer.source import GroupSource
from tests.support.groups import make_group, register, register_env


def _post_as_env(client: httpx.Client, groups: list[dict]) -> None:
    env_id = register_env(client, group_size=len(groups[0]["tokens"]))["env_id"]
    response = client.post("/scored_data_list", json=[{**g, "env_id": env_id} for g in groups])
    assert response.status_code == 200, response.text


def test_pull_waits_then_serves_a_full_batch(api, wire_client):
    source = GroupSource(api.url, batch_size=4, max_token_len=64)
    try:
        first = source.pull()
        assert (first.groups, first.kind) == (None, "waiting")
        # the first press is what lets the environments start: the page says so
        assert first.message.startswith(
            "No batch yet: the environments are still producing the first batch (they "
            "start once the run's trainer, this page, asks for one)."
        )
        assert "0 group(s), 0 sequence(s); a batch needs 4 sequences" in first.message
        assert f"an environment is serving with --env.rollout_server_url {api.url}" in (
            first.message
        )
        _post_as_env(wire_client, [make_group(2, tag=7), make_group(2, tag=8)])
        second = source.pull()
        assert second.kind == "ok"
        assert sorted(g.tokens[0][0] for g in second.groups) == [7, 8]
        _post_as_env(wire_client, [make_group(2, tag=9)])
        third = source.pull()
        assert third.kind == "waiting"
        assert "still producing the next batch. The API holds 1 group(s), 2 sequence(s); " in (
            third.message
        )
        assert "--env.rollout_server_url" not in third.message  # groups are arriving
    finally:
        source.close()


@pytest.mark.integration
def test_unreachable_api():
    url = f"http://127.0.0.1:{free_port()}"
    source = GroupSource(url, batch_size=4, max_token_len=64)
    pulled = source.pull()
    source.close()
    assert pulled.kind == "error" and pulled.groups is None
    assert pulled.message.startswith(f"Cannot reach the trajectory API at {url}")


def test_a_token_is_asked_for_then_used(api_factory):
    api = api_factory("--api-key", "s3cret")
    without = GroupSource(api.url, batch_size=4, max_token_len=64)
    refused = without.pull()
    without.close()
    assert refused.kind == "error" and "wants a token: set ATROPOS_API_KEY" in refused.message
    with_key = GroupSource(api.url, batch_size=4, max_token_len=64, api_key="s3cret")
    waiting = with_key.pull()
    with_key.close()
    assert waiting.kind == "waiting"


def test_a_run_owned_by_another_trainer_is_refused(api, wire_client):
    register(wire_client)  # a real trainer's run (another wandb group/project)
    wire_client.get("/batch")
    source = GroupSource(api.url, batch_size=4, max_token_len=64)
    pulled = source.pull()
    source.close()
    assert pulled.kind == "error" and "refused this viewer as the run's trainer" in pulled.message
    assert wire_client.get("/status").json()["current_step"] == 0


def test_a_new_viewer_does_not_wipe_the_queue(api, wire_client):
    """Upstream's viewer called /reset_data on start; ours must leave queued groups alone."""
    first = GroupSource(api.url, batch_size=8, max_token_len=64)
    assert first.pull().kind == "waiting"  # registered and started the run
    first.close()
    _post_as_env(wire_client, [make_group(2, tag=t) for t in (1, 2, 3)])
    second = GroupSource(api.url, batch_size=8, max_token_len=64)
    try:
        assert second.pull().kind == "waiting"
        assert wire_client.get("/status").json()["queue_size"] == 3
        _post_as_env(wire_client, [make_group(2, tag=4)])
        served = second.pull()
        assert served.kind == "ok"
        assert sorted(g.tokens[0][0] for g in served.groups) == [1, 2, 3, 4]
    finally:
        second.close()
