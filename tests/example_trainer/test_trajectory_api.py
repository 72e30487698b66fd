"""The trainer's API client: a 4xx stops it with the API's words; outages are waited out."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from atroposlib.utils.ports import free_port
from example_trainer.api import APIRefused, TrajectoryAPI, waiting_cause
from example_trainer.config import TrainingConfig
from tests.support.groups import make_group


def config(tmp_path) -> TrainingConfig:
    return TrainingConfig(model_name="unused", batch_size=8, seq_len=64, save_path=str(tmp_path))


def test_a_wrong_key_stops_registration_with_the_answer_and_a_hint(api_factory, tmp_path):
    api = api_factory("--api-key", "right-key")
    client = TrajectoryAPI(api.url)  # no ATROPOS_API_KEY in the test environment
    with pytest.raises(APIRefused, match=r"HTTP 401.*ATROPOS_API_KEY"):
        client.register(config(tmp_path), starting_step=0)


def test_batches_by_step_are_served_again_and_a_bad_step_is_refused(api_factory, tmp_path):
    api = api_factory()
    client = TrajectoryAPI(api.url)
    client.register(config(tmp_path), starting_step=0)
    for tag in (1, 2):
        assert client.http.post("/scored_data", json=make_group(4, tag=tag)).status_code == 200
    first = client.batch(step=1, committed=0)
    assert first is not None and [g.tokens[0][0] for g in first] == [1, 2]
    again = client.batch(step=1, committed=0)
    assert again is not None and [g.tokens[0][0] for g in again] == [1, 2]
    with pytest.raises(APIRefused, match=r"HTTP 409.*the API is at step 1"):
        client.batch(step=7, committed=0)


@pytest.mark.integration
def test_an_unreachable_api_is_a_warning_and_no_batch(tmp_path, caplog):
    client = TrajectoryAPI(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    with caplog.at_level(logging.WARNING, logger="example_trainer"):
        assert client.batch(step=1) is None
    assert "/batch failed" in caplog.text


def test_a_trainer_the_api_forgot_registers_again_at_its_step(api_factory, tmp_path, caplog):
    """An API restarted without its state (here: reset) answers /batch with an error; the
    trainer registers again at the step it is on, instead of stopping the run."""
    api = api_factory()
    client = TrajectoryAPI(api.url)
    client.register(config(tmp_path), starting_step=0)
    for tag in (1, 2):
        assert client.http.post("/scored_data", json=make_group(4, tag=tag)).status_code == 200
    assert client.batch(step=1, committed=0) is not None
    assert client.http.get("/reset_data").status_code == 200
    assert client.http.get("/info").json()["batch_size"] == -1  # it forgot the trainer
    with caplog.at_level(logging.WARNING, logger="example_trainer"):
        assert client.batch(step=2, committed=1) is None
    assert "registering again at step 1" in caplog.text
    assert client.http.get("/info").json()["batch_size"] == 8
    assert client.http.get("/status").json()["current_step"] == 1
    for tag in (3, 4):
        assert client.http.post("/scored_data", json=make_group(4, tag=tag)).status_code == 200
    served = client.batch(step=2, committed=1)
    assert served is not None and [g.tokens[0][0] for g in served] == [3, 4]


def test_the_registration_carries_max_staleness_only_when_set(tmp_path):
    """In-process (a mock transport): the bound goes to /register for environments to
    read from /status-env; without one the field is left out, as upstream's API expects."""
    sent: list[dict] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json={"uuid": 1})

    client = TrajectoryAPI("http://api.invalid")
    client.http = httpx.Client(base_url="http://api.invalid", transport=httpx.MockTransport(answer))
    client.register(config(tmp_path).model_copy(update={"max_staleness": 2}), starting_step=0)
    client.register(config(tmp_path), starting_step=0)
    assert sent[0]["max_staleness"] == 2
    assert "max_staleness" not in sent[1]


def test_the_note_on_a_missing_batch_names_an_env_whose_rollouts_all_fail():
    status = {
        "queued_sequences": 0,
        "env_progress": {
            "even_0": {"groups_sent": 0, "rollout_errors": 24, "context_refusals": 24},
            "math_0": {"groups_sent": 5, "rollout_errors": 2, "context_refusals": 0},
        },
    }
    assert waiting_cause(status, 64) == (
        "even_0 sent 0 groups, and the engine refused all 24 of its failed rollouts for the "
        "model's context length (its log says what to change); math_0 sent 5 groups, and 2 "
        "of its rollouts failed (its log has the first traceback); the API holds 0 sequences "
        "of the 64 a batch needs"
    )
    quiet = waiting_cause({"queued_sequences": 3, "blocked_reason": "min share"}, None)
    assert quiet == (
        "the API holds 3 sequences; batch blocked: min share; no environment reports its "
        "progress (none polls, or they are upstream's)"
    )
    assert waiting_cause("unreachable (refused)") == "the API is unreachable (refused)"
