"""The data tools' trainer client against a real run-api: batches, refusals, resuming."""

from __future__ import annotations

import time

import pytest

from atroposlib.datagen.pull import BatchPuller, PullError
from atroposlib.utils.ports import free_port
from tests.support.datagen import CannedApi, post_groups
from tests.support.groups import make_group, register


def test_registers_then_serves_batches_of_its_size(api, wire_client):
    with BatchPuller(api.url, batch_size=4, max_token_len=64, tool="test-tool") as puller:
        puller.register()
        assert wire_client.get("/info").json() == {"batch_size": 4, "max_token_len": 64}
        assert wire_client.get("/wandb_info").json()["group"] == "test-tool"
        assert puller.next_batch() is None
        post_groups(wire_client, [make_group(2, tag=5), make_group(2, tag=6)])
        batch = puller.next_batch()
    assert batch is not None
    assert sorted(group.tokens[0][0] for group in batch) == [5, 6]
    assert all(group.scores == [0.0, 1.0] for group in batch)


def test_a_second_puller_resumes_the_run_and_keeps_its_queue(api, wire_client):
    with BatchPuller(api.url, 2, 64, tool="t") as first:
        first.register()
        assert first.next_batch() is None  # the run has started
        post_groups(wire_client, [make_group(2, tag=t) for t in (1, 2, 3)])
        assert first.next_batch() is not None
    assert wire_client.get("/status").json()["current_step"] == 1
    with BatchPuller(api.url, 2, 64, tool="t") as second:
        second.register()  # a fresh trainer at step 0 would be refused here
        served = [second.next_batch(), second.next_batch()]
    assert sorted(g.tokens[0][0] for batch in served for g in batch) == [2, 3]


@pytest.mark.integration
def test_unreachable_api_says_to_start_run_api():
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with BatchPuller(url, 2, 64, retry_s=0.5) as puller, pytest.raises(PullError) as caught:
        puller.register()
    assert time.monotonic() - started < 10
    assert f"is run-api running at {url}?" in str(caught.value)
    assert caught.value.status is None


def test_a_key_protected_api_names_the_variable(api_factory, monkeypatch):
    api = api_factory("--api-key", "k")
    with BatchPuller(api.url, 2, 64) as puller, pytest.raises(PullError) as caught:
        puller.register()
    assert caught.value.status == 401 and "set ATROPOS_API_KEY" in str(caught.value)
    monkeypatch.setenv("ATROPOS_API_KEY", "k")
    with BatchPuller(api.url, 2, 64) as puller:
        puller.register()
        assert puller.next_batch() is None


def test_another_trainers_run_is_refused_with_the_apis_reason(api, wire_client):
    register(wire_client)  # a real trainer's run, wandb group "g"
    wire_client.get("/batch")
    with BatchPuller(api.url, 2, 64, tool="atropos-sft-gen") as puller:
        with pytest.raises(PullError) as caught:
            puller.register()
    message = str(caught.value)
    assert caught.value.status == 409
    assert "belongs to another run" in message and "g/p" in message


@pytest.mark.integration
@pytest.mark.parametrize(
    "answer",
    [{"batch": [{"tokens": "not a list", "masks": [], "scores": []}]}, ["no", "batch"]],
)
def test_a_malformed_batch_is_a_pull_error(answer):
    with CannedApi({"/batch": answer}) as server:
        with BatchPuller(server.url, 2, 64) as puller, pytest.raises(PullError) as caught:
            puller.next_batch()
    assert "malformed batch" in str(caught.value)


@pytest.mark.integration
def test_an_answer_that_is_not_json_says_so():
    with CannedApi({"/status": b"<html>a web page</html>"}) as server:
        with BatchPuller(server.url, 2, 64) as puller, pytest.raises(PullError) as caught:
            puller.register()
    assert "did not answer JSON" in str(caught.value) and "a run-api?" in str(caught.value)
