"""A trainer that names its step gets every batch, in order, even when answers are lost.

A1: a trainer that registers again with `starting_step` moves the API to that step.
A2: `/batch?step=N` leases the batch to step N; asking again serves it again, and its
groups stay in the durable store until the trainer reports a checkpoint that holds it
(`committed`). A trainer that does not name its step (upstream's) is served as before.
"""

from __future__ import annotations

import httpx

from tests.support.groups import REGISTRATION, make_group, register, tags_of


def post_groups(client: httpx.Client, tags: range) -> None:
    for tag in tags:
        assert client.post("/scored_data", json=make_group(4, tag=tag)).status_code == 200


def batch_tags(client: httpx.Client, **params: int) -> list[int] | None:
    answer = client.get("/batch", params=params)
    assert answer.status_code == 200, answer.text
    batch = answer.json()["batch"]
    return None if batch is None else tags_of(batch)


def test_a_lost_answer_is_served_again_and_the_step_does_not_run_ahead(client):
    register(client)  # batch_size 8: two groups of 4 per batch
    post_groups(client, range(1, 7))
    assert batch_tags(client, step=1) == [1, 2]
    assert batch_tags(client, step=1) == [1, 2]  # the answer was lost: the same batch again
    assert client.get("/status").json()["current_step"] == 1
    assert batch_tags(client, step=2, committed=0) == [3, 4]
    assert client.get("/status").json()["kept_batch_steps"] == [1, 2]
    assert batch_tags(client, step=3, committed=2) == [5, 6]
    assert client.get("/status").json()["kept_batch_steps"] == [3]


def test_a_step_the_api_cannot_serve_is_refused_with_the_reason(client):
    register(client)
    post_groups(client, range(1, 5))
    assert batch_tags(client, step=1) == [1, 2]
    skipped = client.get("/batch", params={"step": 5})
    assert skipped.status_code == 409
    assert "the API is at step 1" in skipped.json()["detail"]
    assert batch_tags(client, step=2, committed=1) == [3, 4]
    released = client.get("/batch", params={"step": 1})
    assert released.status_code == 409  # step 1 is in a checkpoint and was released
    assert client.get("/batch", params={"step": 0}).status_code == 422


def test_a_resumed_trainer_gets_the_batches_after_its_checkpoint_again(client):
    """A1 + A2: trained steps 1-3, checkpointed at 2, killed, resumed from step-2."""
    register(client)
    post_groups(client, range(1, 9))
    assert batch_tags(client, step=1) == [1, 2]
    assert batch_tags(client, step=2) == [3, 4]
    assert batch_tags(client, step=3, committed=2) == [5, 6]
    register(client, starting_step=2)
    status = client.get("/status").json()
    assert status["current_step"] == 2 and status["kept_batch_steps"] == [3]
    env = client.post(
        "/register-env",
        json={"max_token_length": 64, "desired_name": "e", "weight": 1.0, "group_size": 4},
    ).json()
    assert env["starting_step"] == 2  # environments count from the trainer's step too
    assert batch_tags(client, step=3, committed=2) == [5, 6]
    assert batch_tags(client, step=4, committed=2) == [7, 8]
    assert client.get("/status").json()["current_step"] == 4


def test_upstreams_trainer_keeps_the_destructive_read_and_moves_with_its_registration(client):
    register(client)
    post_groups(client, range(1, 7))
    assert batch_tags(client) == [1, 2]
    assert batch_tags(client) == [3, 4]
    assert client.get("/status").json()["kept_batch_steps"] == []  # nothing kept
    register(client, starting_step=1)
    assert client.get("/status").json()["current_step"] == 1
    assert batch_tags(client) == [5, 6]
    assert client.get("/status").json()["current_step"] == 2


def test_a_leased_batch_survives_kill_9_of_the_api(api_factory, tmp_path):
    api = api_factory(state_dir=tmp_path / "state")
    with httpx.Client(base_url=api.url, timeout=30) as client:
        register(client)
        post_groups(client, range(1, 7))
        assert batch_tags(client, step=1) == [1, 2]
        assert batch_tags(client, step=2) == [3, 4]
    api.kill()
    again = api_factory(state_dir=tmp_path / "state")
    with httpx.Client(base_url=again.url, timeout=30) as client:
        assert client.get("/status").json()["kept_batch_steps"] == [1, 2]
        assert batch_tags(client, step=2, committed=1) == [3, 4]  # its answer was lost
        assert batch_tags(client, step=3, committed=2) == [5, 6]
        assert client.get("/status").json()["kept_batch_steps"] == [3]


def test_another_runs_trainer_is_refused_instead_of_inheriting_this_one(client):
    """X1: the stored state is resumed only by its own run, and only when it asks to."""
    register(client)
    post_groups(client, range(1, 7))
    assert batch_tags(client, step=1) == [1, 2]
    other = client.post("/register", json={**REGISTRATION, "wandb_group": "another"})
    assert other.status_code == 409
    assert "belongs to run g/p" in other.json()["detail"]
    assert batch_tags(client, step=2, committed=1) == [3, 4]  # a checkpoint holds step 1
    fresh = client.post("/register", json=REGISTRATION)  # same run, but from step 0
    assert fresh.status_code == 409  # it would skip batch 1, which the checkpoint released
    assert "resume it from a checkpoint" in fresh.json()["detail"]
    assert client.get("/status").json()["current_step"] == 2  # nothing was inherited or moved
    register(client, starting_step=1)  # the same run resuming: accepted


def test_a_trainer_that_died_before_its_first_checkpoint_starts_over_on_the_same_batches(
    client,
):
    """RUN-1: it came back from step 0, was refused with 409, and the run ended."""
    register(client)
    post_groups(client, range(1, 9))
    assert batch_tags(client, step=1) == [1, 2]
    assert batch_tags(client, step=2) == [3, 4]
    assert batch_tags(client, step=3) == [5, 6]  # no checkpoint yet: nothing committed
    register(client)  # restarted without --resume: starting_step 0
    status = client.get("/status").json()
    assert status["current_step"] == 0 and status["kept_batch_steps"] == [1, 2, 3]
    assert batch_tags(client, step=1) == [1, 2]
    assert batch_tags(client, step=2) == [3, 4]
    assert batch_tags(client, step=3, committed=2) == [5, 6]
    assert batch_tags(client, step=4) == [7, 8]  # then on to what it never saw


def test_a_trainer_that_restarts_before_any_batch_registers_again(client):
    register(client)
    register(client)  # step 0 both times: nothing to inherit
    assert client.get("/status").json()["current_step"] == 0


def test_a_plain_batch_cannot_take_a_batch_from_a_trainer_that_leases(client):
    """API-4: one plain GET /batch from anyone took a batch, and the trainer's next
    request by step was refused with 409, which ended the run."""
    register(client)
    post_groups(client, range(1, 7))
    assert batch_tags(client, step=1) == [1, 2]
    stolen = client.get("/batch")
    assert stolen.status_code == 409 and "takes its batches by step" in stolen.json()["detail"]
    assert batch_tags(client, step=2) == [3, 4]  # nothing was taken
    register(client, starting_step=2)  # a trainer that registers anew may read plainly
    assert batch_tags(client) == [5, 6]
