"""`GET /batch` with `Prefer: wait=N` answers the moment a batch can be made.

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
from tests.support.groups import make_group, register, tags_of
from tests.support.inprocess_api import inprocess_api


@pytest.fixture
def client(tmp_path) -> Iterator[httpx.Client]:
    with inprocess_api(tmp_path / "state", ephemeral=True) as api:
        register(api)  # batch_size 8: two groups of 4
        yield api


@pytest.fixture
def held(monkeypatch) -> threading.Event:
    """Set once a /batch request is held, waiting for the next post."""
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
