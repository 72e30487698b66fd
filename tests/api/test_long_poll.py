"""`GET /batch` and `GET /status-env` with `Prefer: wait=N` answer the moment they can.

Served in-process: without the header an empty /batch answers at once (upstream's
behaviour); with it the request is held until a post completes a batch, or N seconds
pass; `Preference-Applied` says the API waited. In-process, the test also knows the
moment the request starts waiting, so the post that completes the batch is sent then,
not after a guessed sleep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from atroposlib.api.long_poll import MAX_WAIT_S, Arrivals, requested_wait
from tests.support.groups import make_group, register, register_env, tags_of
from tests.support.inprocess_api import inprocess_api


@pytest.fixture
def client(tmp_path) -> Iterator[httpx.Client]:
    with inprocess_api(tmp_path / "state", ephemeral=True) as api:
        register(api)  # batch_size 8: two groups of 4
        yield api


@pytest.fixture
def held(monkeypatch) -> threading.Event:
    """Set once a request is held: a /batch waiting for a post, a /status-env for a batch."""
    entered = threading.Event()
    wait = Arrivals.wait

    async def noted_wait(self: Arrivals, timeout_s: float) -> None:
        entered.set()
        await wait(self, timeout_s)

    monkeypatch.setattr(Arrivals, "wait", noted_wait)
    return entered


def test_an_empty_batch_answers_at_once_without_the_header(client, held):
    started = time.monotonic()
    answer = client.get("/batch")
    assert time.monotonic() - started < 1.0
    assert answer.json() == {"batch": None}
    assert "preference-applied" not in answer.headers
    assert not held.is_set()


def test_a_held_batch_request_answers_as_soon_as_a_post_completes_the_batch(client, held):
    assert client.post("/scored_data", json=make_group(4, tag=1)).status_code == 200
    posted_at: list[float] = []

    def post_once_held() -> None:
        assert held.wait(20), "the /batch request was never held"
        posted_at.append(time.monotonic())
        assert client.post("/scored_data", json=make_group(4, tag=2)).status_code == 200

    thread = threading.Thread(target=post_once_held)
    thread.start()
    answer = client.get("/batch", params={"step": 1}, headers={"Prefer": "wait=20"})
    answered_at = time.monotonic()
    thread.join()
    assert answer.status_code == 200, answer.text
    assert tags_of(answer.json()["batch"]) == [1, 2]
    assert answer.headers["preference-applied"] == "wait=20"
    assert answered_at - posted_at[0] < 2.0  # not the 20 s the request allowed


def test_a_held_request_without_data_answers_empty_after_its_wait(client, held):
    started = time.monotonic()
    answer = client.get("/batch", headers={"Prefer": "wait=1.5"})
    waited = time.monotonic() - started
    assert held.is_set()
    assert answer.json() == {"batch": None}
    assert 1.4 <= waited < 5.0
    assert answer.headers["preference-applied"] == "wait=1.5"


def test_the_wait_is_read_from_the_prefer_header_and_capped():
    assert requested_wait(None) == 0.0
    assert requested_wait("respond-async, wait=3") == 3.0
    assert requested_wait("wait=2.5") == 2.5
    assert requested_wait("WAIT = 4") == 4.0
    assert requested_wait("wait=-1") == 0.0  # malformed: no wait
    assert requested_wait("wait=lots") == 0.0
    assert requested_wait("wait=100000") == MAX_WAIT_S


def env_of_a_started_trainer(client: httpx.Client) -> int:
    client.get("/batch")  # the trainer's first call (empty: no batch is taken)
    return register_env(client)["env_id"]


def held_status(client: httpx.Client, env_id: int, after_step: int, wait: str) -> httpx.Response:
    return client.get(
        "/status-env",
        params={"env_id": env_id, "after_step": after_step},
        headers={"Prefer": f"wait={wait}"},
    )


def test_a_held_env_status_answers_as_soon_as_the_trainer_takes_a_batch(client, held):
    """An env with a full window waits for room; the room opens when a batch is taken."""
    env_id = env_of_a_started_trainer(client)
    for tag in (1, 2):
        assert client.post("/scored_data", json=make_group(4, tag=tag)).status_code == 200
    taken_at: list[float] = []

    def take_a_batch_once_held() -> None:
        assert held.wait(20), "the /status-env request was never held"
        taken_at.append(time.monotonic())
        assert tags_of(client.get("/batch").json()["batch"]) == [1, 2]

    thread = threading.Thread(target=take_a_batch_once_held)
    thread.start()
    answer = held_status(client, env_id, after_step=0, wait="20")
    answered_at = time.monotonic()
    thread.join()
    assert answer.status_code == 200, answer.text
    assert answer.json()["current_step"] == 1
    assert answer.headers["preference-applied"] == "wait=20"
    assert answered_at - taken_at[0] < 2.0  # not the 20 s the request allowed


def test_a_held_env_status_answers_at_once_when_a_batch_went_since(client, held):
    env_id = env_of_a_started_trainer(client)
    for tag in (1, 2):
        client.post("/scored_data", json=make_group(4, tag=tag))
    client.get("/batch")
    started = time.monotonic()
    answer = held_status(client, env_id, after_step=0, wait="20")
    assert time.monotonic() - started < 2.0
    assert answer.json()["current_step"] == 1 and not held.is_set()


def test_a_held_env_status_answers_after_its_wait_and_checks_its_step(client, held):
    env_id = env_of_a_started_trainer(client)
    started = time.monotonic()
    answer = held_status(client, env_id, after_step=0, wait="1.5")
    waited = time.monotonic() - started
    assert held.is_set() and 1.4 <= waited < 5.0
    assert answer.json()["current_step"] == 0
    assert answer.headers["preference-applied"] == "wait=1.5"
    bad = client.get("/status-env", params={"env_id": env_id, "after_step": -1})
    assert bad.status_code in (400, 422) and "after_step" in bad.text
    plain = client.get("/status-env", params={"env_id": env_id})  # upstream's: no hold
    assert plain.status_code == 200 and "preference-applied" not in plain.headers
