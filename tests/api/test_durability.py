"""Durability, idempotency and back-pressure, with real processes killed for real."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.support.groups import (
    drain_batches,
    make_group,
    register,
    register_env,
    start_trainer,
    tags_of,
)
from tests.support.inprocess_api import inprocess_api
from tests.support.processes import ApiProcess
from tests.support.waiting import wait_until


def drain(client: httpx.Client) -> list[int]:
    return [tag for batch in drain_batches(client) for tag in tags_of(batch)]


def test_restart_keeps_queue_buffers_envs_and_step(api_factory):
    api = api_factory()
    with httpx.Client(base_url=api.url) as client:
        start_trainer(client, batch_size=8, starting_step=3)
        register_env(client, group_size=4, desired_name="math")
        for tag in range(5):
            client.post("/scored_data", json=make_group(4, tag=tag, env_id=0))
        client.post("/scored_data", json=make_group(2, tag=50, env_id=0))  # buffered
        assert tags_of(client.get("/batch").json()["batch"]) == [0, 1]
    api.stop()
    api.start()
    with httpx.Client(base_url=api.url) as client:
        assert client.get("/status").json()["current_step"] == 4
        assert client.get("/status").json()["queue_size"] == 3
        assert client.get("/info").json() == {"batch_size": 8, "max_token_len": 64}
        assert client.get("/latest_example").json()["tokens"][0][0] == 4
        # the env table survived: a second "math" env is math_1, and the buffer completes
        assert register_env(client, desired_name="math")["wandb_name"] == "math_1"
        assert client.post("/scored_data", json=make_group(2, tag=51, env_id=0)).json() == {
            "status": "buffered",
            "buffer_size": 0,
        }
        assert drain(client) == [2, 3, 4, 50, 51]


def test_ephemeral_mode_keeps_nothing(api_factory):
    api = api_factory("--ephemeral")
    with httpx.Client(base_url=api.url) as client:
        assert client.get("/health").json()["store"] == "memory"
        register(client)
        client.post("/scored_data", json=make_group(4))
    api.stop()
    api.start()
    assert httpx.get(f"{api.url}/info").json() == {"batch_size": -1, "max_token_len": -1}
    assert not (api.state_dir / "trajectories.sqlite3").exists()


@pytest.mark.e2e
def test_kill_9_under_load_loses_and_duplicates_nothing(api_factory):
    api = api_factory()
    with httpx.Client(base_url=api.url) as client:
        start_trainer(client, batch_size=8, max_token_len=512)
    acknowledged: list[int] = []
    lock = threading.Lock()
    errors: list[str] = []
    transport_errors: list[int] = []

    def poster(first_tag: int, count: int) -> None:
        with httpx.Client(base_url=api.url, timeout=5) as session:
            for tag in range(first_tag, first_tag + count):
                body = make_group(4, tag=tag, length=256)
                deadline = time.monotonic() + 60
                while True:
                    try:
                        response = session.post(
                            "/scored_data", json=body, headers={"Idempotency-Key": f"group-{tag}"}
                        )
                        if response.status_code == 200:
                            with lock:
                                acknowledged.append(tag)
                            break
                        if response.status_code < 500:
                            errors.append(response.text)
                            return
                    except httpx.TransportError:
                        transport_errors.append(tag)
                    if time.monotonic() > deadline:
                        errors.append(f"group {tag} never acknowledged")
                        return
                    time.sleep(0.02)

    threads = [threading.Thread(target=poster, args=(i * 1000, 150)) for i in range(4)]
    for thread in threads:
        thread.start()
    wait_until(
        lambda: errors or len(acknowledged) >= 150,
        60,
        "the posters stalled before 150 groups were acknowledged",
        poll_s=0.01,
    )
    assert not errors, errors[:3]
    refused_before = len(transport_errors)
    api.kill()
    killed_after = len(acknowledged)
    # the posters keep retrying against the dead port until run-api is back up
    wait_until(
        lambda: len(transport_errors) > refused_before,
        30,
        "no poster noticed that run-api was down",
    )
    api.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]
    assert killed_after < 600, "the kill happened after the load ended"
    with httpx.Client(base_url=api.url) as client:
        served = drain(client)
    assert len(served) == len(set(served)), "a group was served twice"
    assert sorted(served) == sorted(acknowledged)
    assert len(acknowledged) == 600


def test_idempotency_key_answers_repeat_without_queueing_twice(client):
    register(client, batch_size=4)
    key = {"Idempotency-Key": "abc-1"}
    first = client.post("/scored_data", json=make_group(4, tag=1), headers=key)
    again = client.post("/scored_data", json=make_group(4, tag=1), headers=key)
    assert first.json() == again.json() == {"status": "received"}
    listed = [make_group(2, tag=2), make_group(2, tag=3)]
    for _ in range(2):
        answer = client.post("/scored_data_list", json=listed, headers={"Idempotency-Key": "abc-2"})
        assert answer.json() == {"status": "received", "groups_processed": 2}
    assert client.get("/status").json()["queue_size"] == 3
    assert "atropos_idempotent_replays_total 2.0" in client.get("/metrics").text


def test_a_replay_long_after_its_post_is_answered_not_queued_again(tmp_path, monkeypatch):
    """DUR-3: an environment killed between the API's 200 and its spool's unlink posts
    the group again when it resumes, maybe hours later, and across an API restart: the
    answer is the first one's, and the trainer gets the group once."""
    import atroposlib.api.idempotency as state_module

    key = {"Idempotency-Key": "spooled-1"}
    with inprocess_api(tmp_path / "state") as client:
        register(client, batch_size=4)
        first = client.post("/scored_data", json=make_group(4, tag=1), headers=key)
        assert first.status_code == 200
    later = time.time() + 2 * 86400  # two days on
    monkeypatch.setattr(state_module.time, "time", lambda: later)
    with inprocess_api(tmp_path / "state") as client:
        again = client.post("/scored_data", json=make_group(4, tag=1), headers=key)
        assert again.json() == {"status": "received"}
        assert client.get("/status").json()["queue_size"] == 1
    # a TTL, where one is set, still forgets
    with inprocess_api(tmp_path / "state", idempotency_ttl_s=3600) as client:
        client.post("/scored_data", json=make_group(4, tag=1), headers=key)
        assert client.get("/status").json()["queue_size"] == 2


def test_queue_cap_answers_503_then_recovers(api_factory):
    api = api_factory("--max-queued-sequences", "16", "--retry-after-s", "3")
    with httpx.Client(base_url=api.url) as client:
        start_trainer(client, batch_size=8)
        for tag in range(4):
            assert client.post("/scored_data", json=make_group(4, tag=tag)).status_code == 200
        full = client.post("/scored_data", json=make_group(4, tag=4))
        assert full.status_code == 503
        assert full.headers["retry-after"] == "3"
        assert "max-queued-sequences" in full.json()["detail"]
        assert tags_of(client.get("/batch").json()["batch"]) == [0, 1]
        assert client.post("/scored_data", json=make_group(4, tag=4)).status_code == 200
        assert drain(client) == [2, 3]
        assert (
            'atropos_rejected_requests_total{reason="queue_full"} 1.0'
            in client.get("/metrics").text
        )


def test_second_server_on_the_same_state_dir_refuses(api_factory, tmp_path):
    first = api_factory()
    second = ApiProcess(first.state_dir)
    with pytest.raises(RuntimeError) as failure:
        second.start()
    assert "another run-api process is using the state directory" in str(failure.value)
