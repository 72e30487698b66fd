"""Every endpoint and answer shape of docs/api.md, served in-process by `create_app`.

The same app as `run-api`, over its real SQLite store; what only a process shows (kill -9,
uvicorn, auth over the wire) is tested in test_durability.py, test_auth.py and
test_uvicorn_target.py.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from atroposlib.api.settings import APISettings
from tests.support.groups import (
    REGISTRATION,
    drain_batches,
    make_group,
    register,
    register_env,
    start_trainer,
    tags_of,
)
from tests.support.inprocess_api import inprocess_api


def test_root_and_health(client):
    assert client.get("/").json() == {"message": "AtroposLib API"}
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["store"] == "sqlite"


def test_answers_before_registration(client):
    assert client.get("/status").json() == {"current_step": 0, "queue_size": 0}
    assert client.get("/info").json() == {"batch_size": -1, "max_token_len": -1}
    assert client.get("/wandb_info").json() == {"group": None, "project": None}
    answer = client.get("/batch").json()
    assert answer["status"] == "error" and answer["batch"] == [] and answer["message"]
    example = client.get("/latest_example").json()
    assert set(example) == {
        "tokens",
        "masks",
        "scores",
        "advantages",
        "ref_logprobs",
        "generation_params",
        "inference_logprobs",
        "messages",
        "images",
    }
    assert all(value == [] for value in example.values())
    body = {"max_token_length": 64, "desired_name": "e", "weight": 1.0, "group_size": 4}
    assert client.post("/register-env", json=body).json() == {"status": "wait for trainer to start"}


def test_register_and_env_handshake(client):
    first = register(client, starting_step=5)
    assert isinstance(first["uuid"], int)
    assert client.get("/info").json() == {"batch_size": 8, "max_token_len": 64}
    assert client.get("/wandb_info").json() == {"group": "g", "project": "p"}
    waiting = {"max_token_length": 64, "desired_name": "math", "weight": 1.0, "group_size": 4}
    assert (
        client.post("/register-env", json=waiting).json()["status"] == "wait for trainer to start"
    )
    assert client.get("/batch").json() == {"batch": None}  # marks the trainer as started
    env0 = register_env(client, desired_name="math")
    env1 = register_env(client, desired_name="math")
    env2 = register_env(client, desired_name="code")
    assert env0 == {
        "status": "success",
        "env_id": 0,
        "wandb_name": "math_0",
        "checkpoint_dir": "/tmp/ckpt",
        "starting_step": 5,
        "checkpoint_interval": 10,
        "num_steps": 100,
    }
    assert (env1["env_id"], env1["wandb_name"]) == (1, "math_1")
    assert (env2["env_id"], env2["wandb_name"]) == (2, "code_0")
    assert client.post("/disconnect-env", json={"env_id": 1}).json() == {"status": "success"}
    failure = client.post("/disconnect-env", json={"env_id": 9}).json()
    assert failure["status"] == "failure" and "9" in failure["error"]


def test_batches_are_exact_oldest_first_and_fields_are_kept(client):
    start_trainer(client)
    register_env(client, group_size=4)
    group = make_group(4, tag=0, env_id=0)
    group.update(
        advantages=[[0.5] * 4] * 4,
        generation_params={"temperature": 1.0},
        messages=[[{"role": "user", "content": "hi", "reward": None}]] * 4,
        overrides=[{"set_advantage_to_zero": True}] * 4,
        group_overrides={"group_size": 4},
        distill_token_ids=[[[1, 2]] * 4] * 4,
    )
    assert client.post("/scored_data", json=group).json() == {"status": "received"}
    for tag in range(1, 6):
        client.post("/scored_data", json=make_group(4, tag=tag, env_id=0))
    assert client.get("/status").json()["queue_size"] == 6
    first = client.get("/batch").json()["batch"]
    assert tags_of(first) == [0, 1]
    assert sum(len(g["tokens"]) for g in first) == 8
    for key, value in group.items():
        assert first[0][key] == value, key
    assert first[1]["advantages"] is None and first[1]["inference_logprobs"] is None
    assert tags_of(client.get("/batch").json()["batch"]) == [2, 3]
    assert tags_of(client.get("/batch").json()["batch"]) == [4, 5]
    assert client.get("/batch").json() == {"batch": None}
    assert client.get("/status").json()["current_step"] == 3


def test_scored_data_list_answer_shape(client):
    start_trainer(client)
    register_env(client, group_size=4)
    groups = [make_group(4, tag=1, env_id=0), make_group(4, tag=2, env_id=0)]
    assert client.post("/scored_data_list", json=groups).json() == {
        "status": "received",
        "groups_processed": 2,
    }
    mixed = [
        make_group(2, tag=3, env_id=0),
        make_group(4, tag=4, env_id=0),
        make_group(1, tag=5, env_id=0),
    ]
    assert client.post("/scored_data_list", json=mixed).json() == {
        "status": "received",
        "groups_processed": 3,
        "buffered": 2,
        "last_buffer_size": 3,
    }


def test_off_size_groups_are_buffered_until_they_fill_a_group(client):
    start_trainer(client)
    register_env(client, group_size=4)
    assert client.post("/scored_data", json=make_group(2, tag=1, env_id=0)).json() == {
        "status": "buffered",
        "buffer_size": 2,
    }
    client.post("/scored_data", json=make_group(4, tag=2, env_id=0))
    assert client.post("/scored_data", json=make_group(2, tag=3, env_id=0)).json() == {
        "status": "buffered",
        "buffer_size": 0,
    }
    assert client.get("/status").json()["queue_size"] == 3
    batch = client.get("/batch").json()["batch"]
    # the buffered pair was queued (in its original order) after the group of 4
    assert tags_of(batch) == [2, 1, 3]


def test_mixed_group_sizes_pack_into_exact_batches(client):
    start_trainer(client, batch_size=8)
    for tag, size in enumerate([4, 8, 4, 2, 2, 2, 2]):
        client.post("/scored_data", json=make_group(size, tag=tag))
    batches = drain_batches(client)
    assert all(sum(len(g["tokens"]) for g in batch) == 8 for batch in batches)
    assert [tags_of(batch) for batch in batches] == [[1], [0, 2], [3, 4, 5, 6]]


def test_min_batch_allocation_reserves_part_of_each_batch(client):
    start_trainer(client, batch_size=8)
    register_env(client, group_size=4, desired_name="big")
    register_env(client, group_size=4, desired_name="small", min_batch_allocation=0.5)
    for tag in range(4):
        client.post("/scored_data", json=make_group(4, tag=tag, env_id=0))
    client.post("/scored_data", json=make_group(4, tag=10, env_id=1))
    first = client.get("/batch").json()["batch"]
    assert sorted(g["env_id"] for g in first) == [0, 1]
    assert tags_of(first) == [0, 10]
    status = client.get("/status-env", params={"env_id": 0}).json()
    assert status["unallocated_fraction"] == 0.5


def test_status_env_fields(client):
    """Hand-worked: a trainer taking batches of 8 sequences, and two envs of equal context.

    env 0: groups of 4, weight 1, no minimum share.
    env 1: groups of 2, weight 3, min_batch_allocation 0.25 (2 sequences of every batch of 8).
    """
    start_trainer(client, batch_size=8)
    register_env(client, group_size=4, max_token_length=100, weight=1.0)
    register_env(client, group_size=2, max_token_length=100, weight=3.0, min_batch_allocation=0.25)
    for tag in range(3):
        client.post("/scored_data", json=make_group(4, tag=tag, env_id=0))
    client.post("/scored_data", json=make_group(2, tag=9, env_id=1))
    by_body = client.request("GET", "/status-env", json={"env_id": 0}).json()
    by_query = client.get("/status-env", params={"env_id": 0}).json()
    assert by_body == by_query
    # Queued: env 0 has 3 groups of 4 (12 sequences), env 1 one group of 2. The largest
    # group queued holds 4. Env 0 has a quarter of the weight (1 of 1 + 3), and a quarter
    # of each batch is promised to env 1, so three quarters are unallocated. The queue
    # holds 14 sequences: 3 whole groups of env 0's size.
    assert by_body == {
        "current_step": 0,
        "queue_size": 3,
        "unallocated_fraction": 0.75,
        "self_queue_size": 3,
        "max_group_size": 4,
        "env_weight": 0.25,
        "max_staleness": None,  # ours: the trainer registered no bound
        "batch_size": 8,  # ours: the trainer's, so an env sees it change
    }
    # Env 1 owns 1 queued group of 2, and every one of env 0's 12 sequences counts
    # against it (env 0 reserves nothing): 14 sequences = 7 groups of 2.
    other = client.get("/status-env", params={"env_id": 1}).json()
    assert other["queue_size"] == 7 and other["self_queue_size"] == 1
    assert other["env_weight"] == 0.75 and other["unallocated_fraction"] == 0.75

    # Two more groups of env 1: its 6 queued sequences occupy two packs of 4 (8 places, the
    # second pack half full). Less the 2 places reserved for env 1, 6 count against env 0:
    # 12 + 6 = 18 sequences = 4 whole groups of 4.
    for tag in (10, 11):
        client.post("/scored_data", json=make_group(2, tag=tag, env_id=1))
    mine = client.get("/status-env", params={"env_id": 0}).json()
    assert mine["queue_size"] == 4 and mine["self_queue_size"] == 3
    # Env 1: its own 6 sequences plus env 0's 12 = 18 = 9 groups of 2, 3 of them its own.
    other = client.get("/status-env", params={"env_id": 1}).json()
    assert other["queue_size"] == 9 and other["self_queue_size"] == 3

    assert client.get("/status-env", params={"env_id": 5}).status_code == 404
    # Once env 1 disconnects, env 0 is the only connected env: it has all the weight, and
    # nothing is promised to anyone any more.
    client.post("/disconnect-env", json={"env_id": 1})
    alone = client.get("/status-env", params={"env_id": 0}).json()
    assert alone["env_weight"] == 1.0 and alone["unallocated_fraction"] == 1.0


def test_status_env_tells_envs_the_trainers_max_staleness(tmp_path):
    """The bound a trainer registers reaches every env's /status-env; a trainer that
    registers again (resumed, with another bound or none) replaces it, and a restarted
    API still knows it."""
    with inprocess_api(tmp_path / "state") as client:
        start_trainer(client, max_staleness=2)
        env_id = register_env(client)["env_id"]

        def bound() -> int | None:
            return client.get("/status-env", params={"env_id": env_id}).json()["max_staleness"]

        assert bound() == 2
        register(client, max_staleness=0)
        assert bound() == 0
        register(client)  # no bound this time
        assert bound() is None
        register(client, max_staleness=5)
        refused = client.post("/register", json={**REGISTRATION, "max_staleness": -1})
        assert refused.status_code == 422
        assert bound() == 5
    with inprocess_api(tmp_path / "state") as client:
        assert client.get("/status-env", params={"env_id": env_id}).json()["max_staleness"] == 5


def test_status_env_tells_envs_the_trainers_batch_size(tmp_path):
    """A trainer that registers again with another batch size shows in every env's poll."""
    with inprocess_api(tmp_path / "state") as client:
        start_trainer(client, batch_size=4)
        env_id = register_env(client)["env_id"]

        def batch_size() -> int | None:
            return client.get("/status-env", params={"env_id": env_id}).json()["batch_size"]

        assert batch_size() == 4
        register(client, batch_size=16)
        assert batch_size() == 16


def test_posts_before_register_count_after_registration(client):
    for tag in range(4):
        assert client.post("/scored_data", json=make_group(2, tag=tag)).status_code == 200
    assert client.get("/status").json() == {"current_step": 0, "queue_size": 0}
    start_trainer(client, batch_size=8)
    assert client.get("/status").json()["queue_size"] == 0  # the first /batch took them
    assert client.get("/status").json()["current_step"] == 1


def test_second_register_updates_settings_and_keeps_queue(client):
    register(client, batch_size=8)
    for tag in range(3):
        client.post("/scored_data", json=make_group(4, tag=tag))
    register(client, batch_size=12, max_token_len=128, num_steps=7)
    assert client.get("/info").json() == {"batch_size": 12, "max_token_len": 128}
    assert tags_of(client.get("/batch").json()["batch"]) == [0, 1, 2]


@pytest.mark.parametrize("method", ["POST", "GET"])  # GET: upstream's form, keyless APIs only
def test_reset_data_clears_everything(client, method):
    start_trainer(client)
    register_env(client)
    client.post("/scored_data", json=make_group(4, tag=1, env_id=0))
    response = client.request(method, "/reset_data", json={} if method == "POST" else None)
    assert response.status_code == 200 and response.text == "Reset successful"
    assert client.get("/status").json() == {"current_step": 0, "queue_size": 0}
    assert client.get("/info").json() == {"batch_size": -1, "max_token_len": -1}
    assert client.get("/batch").json()["status"] == "error"
    assert client.get("/status-env", params={"env_id": 0}).status_code == 404


def test_latest_example_is_the_newest_queued_group(client):
    register(client)
    client.post("/scored_data", json=make_group(2, tag=1))
    client.post("/scored_data", json=make_group(2, tag=2, env_id=None))
    latest = client.get("/latest_example").json()
    assert latest["tokens"][0][0] == 2 and latest["env_id"] is None


def test_non_finite_logprobs_where_nothing_is_trained_come_back_unchanged(client):
    """Placeholders (NaN, -inf, vLLM's -9999) are fine on positions the loss never reads:
    the first token and masked ones. Where a token is trained they are refused (below)."""
    start_trainer(client, batch_size=2)
    body = (
        '{"tokens": [[1, 2, 5], [3, 4, 5]], "masks": [[-100, -100, 5], [-100, -100, 5]],'
        ' "scores": [1.0, 0.0],'
        ' "inference_logprobs": [[NaN, -Infinity, -0.1], [-0.5, Infinity, -0.2]]}'
    )
    response = client.post(
        "/scored_data", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200, response.text
    text = client.get("/batch").text
    assert "[NaN, -Infinity, -0.1]" in text.replace(",-", ", -") or "[NaN,-Infinity,-0.1]" in text
    batch = json.loads(text)["batch"]  # Python's json reads the constants back
    values = batch[0]["inference_logprobs"]
    assert (
        values[0][1] == float("-inf")
        and values[1][1] == float("inf")
        and values[0][0] != values[0][0]
    )


JSON = {"content-type": "application/json"}

POISON = {
    # RUN-3: each crashed the trainer on every restart, since the lease served it again
    "a NaN logprob at a trained position": (
        {"inference_logprobs": [[0.0, -0.1, float("nan")], [0.0, -0.2, -0.3]]},
        ["inference_logprobs", 0, 2],
        "inference_logprobs[0][2] is nan at a trained position",
    ),
    # VAL-1 of the trainer review: the prompt's 1.0 placeholder on a trained token passed,
    # and the trainer then took exp(logp - 1) as that token's ratio
    "a positive logprob at a trained position": (
        {"inference_logprobs": [[1.0, -0.1, 1.0], [0.0, -0.2, -0.3]]},
        ["inference_logprobs", 0, 2],
        "inference_logprobs[0][2] is 1.0 at a trained position (a log-probability above 0)",
    ),
    "an infinite advantage at a trained position": (
        {"advantages": [[0.0, 1.0, 1.0], [0.0, float("-inf"), 0.0]]},
        ["advantages", 1, 1],
        "advantages[1][1] is -inf at a trained position",
    ),
    "a negative token id": (
        {"tokens": [[1, -2, 5], [3, 4, 5]]},
        ["tokens", 0],
        "token id -2 is outside 0 to 318, the trainer's vocabulary",
    ),
    "a token id past the trainer's vocabulary": (
        {"tokens": [[1, 2, 5], [3, 4, 320]]},
        ["tokens", 1],
        "token id 320 is outside 0 to 318, the trainer's vocabulary",
    ),
    "an empty sequence": (
        {"tokens": [[1, 2, 5], []], "masks": [[-100, 2, 5], []]},
        ["tokens", 1],
        "a sequence needs at least one token",
    ),
}


CLEAN = {
    "tokens": [[1, 2, 5], [3, 4, 5]],
    "masks": [[-100, 2, 5], [-100, 4, 5]],
    "scores": [1.0, 0.0],
}


@pytest.mark.parametrize("poison", POISON)
def test_a_group_the_trainer_cannot_train_on_is_refused_at_intake(client, poison):
    start_trainer(client, batch_size=2, vocab_size=319)
    fields, loc, message = POISON[poison]
    body = json.dumps({**CLEAN, **fields})  # NaN and Infinity as Python writes them
    response = client.post("/scored_data", content=body, headers=JSON)
    assert response.status_code == 422, response.text
    issue = {"type": "value_error", "loc": ["body", *loc], "msg": message}
    assert issue in response.json()["detail"]
    assert client.get("/status").json()["queue_size"] == 0  # nothing was queued
    assert client.post("/scored_data", json=CLEAN).status_code == 200


def test_without_a_declared_vocabulary_any_non_negative_id_is_accepted(client):
    """Upstream's trainers do not send `vocab_size`; only the sign can be checked."""
    start_trainer(client, batch_size=2)
    group = {"tokens": [[1, 10**6]], "masks": [[-100, 10**6]], "scores": [1.0]}
    assert client.post("/scored_data", json=group).status_code == 200


def test_gzip_bodies(client):
    start_trainer(client, batch_size=4)
    payload = gzip.compress(json.dumps(make_group(4, tag=7)).encode())
    headers = {"content-encoding": "gzip", "content-type": "application/json"}
    assert client.post("/scored_data", content=payload, headers=headers).json() == {
        "status": "received"
    }
    assert tags_of(client.get("/batch").json()["batch"]) == [7]
    bad = client.post("/scored_data", content=b"not gzip at all", headers=headers)
    assert bad.status_code == 400 and "gzip" in bad.text.lower()
    truncated = client.post("/scored_data", content=payload[:-10], headers=headers)
    assert truncated.status_code == 400


def test_unformable_batch_is_reported_not_silent(client, caplog):
    start_trainer(client, batch_size=12)
    for tag in range(2):
        client.post("/scored_data", json=make_group(8, tag=tag))
    assert client.get("/batch").json() == {"batch": None}
    status = client.get("/status").json()
    assert status["batch_blocked"] is True and "batch_size 12" in status["blocked_reason"]
    assert "atropos_batch_blocked 1.0" in client.get("/metrics").text
    assert "no batch can be formed" in caplog.text
    client.post("/scored_data", json=make_group(4, tag=5))  # 8 + 4 = 12 now exists
    assert tags_of(client.get("/batch").json()["batch"]) == [0, 5]
    assert client.get("/status").json()["batch_blocked"] is False


def test_metrics_exposition(client):
    start_trainer(client, batch_size=4)
    register_env(client, group_size=4)
    for tag in range(3):
        client.post("/scored_data", json=make_group(4, tag=tag, env_id=0))
    client.get("/batch")
    text = client.get("/metrics").text
    for line in (
        "atropos_queued_groups 2.0",
        "atropos_queued_sequences 8.0",
        "atropos_groups_received_total 3.0",
        "atropos_batches_served_total 1.0",
        "atropos_sequences_served_total 4.0",
        'atropos_env_queued_total{env_id="0",kind="groups"} 3.0',
        'atropos_env_queue_sequences{env_id="0"} 8.0',
    ):
        assert line in text, line
    assert 'atropos_request_duration_seconds_count{path="/scored_data"} 3.0' in text


def test_gzip_responses_on_request(tmp_path):
    with inprocess_api(tmp_path / "state", gzip_responses=True) as client:
        client.headers["Accept-Encoding"] = "gzip"
        start_trainer(client, batch_size=4, max_token_len=1024)
        assert client.post("/scored_data", json=make_group(4, tag=3, length=600)).status_code == 200
        response = client.get("/batch")
        assert response.headers["content-encoding"] == "gzip"
        assert tags_of(response.json()["batch"]) == [3]


def test_module_level_app_reads_settings_from_environment(monkeypatch, tmp_path):
    import atroposlib.api as api_package
    import atroposlib.api.server as server_module

    settings = APISettings(state_dir=str(tmp_path / "s"), ephemeral=True)
    monkeypatch.setenv(api_package.SETTINGS_ENV, settings.model_dump_json())
    monkeypatch.setattr(server_module, "_app", None)
    assert api_package.app is server_module.app  # one definition, two import paths
    with TestClient(server_module.app) as client:
        assert client.get("/").json() == {"message": "AtroposLib API"}
        assert client.get("/health").json()["store"] == "memory"


@pytest.mark.integration  # a fresh interpreter, so nothing is imported yet
def test_importing_server_opens_no_store(tmp_path):
    """Importing `create_app` (or touching `app`) must not create ./.atropos."""
    code = "import atroposlib.api.server as s; s.create_app(); s.app; import atroposlib.api"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_envs_counters_from_its_poll_reach_status_by_its_name(client):
    """What the trainer's note on a missing batch reads (example_trainer/api.py)."""
    start_trainer(client, batch_size=8)
    register_env(client, group_size=4, desired_name="even")
    assert client.get("/status").json()["env_progress"] == {}  # polled, but reported nothing
    counts = {"groups_sent": 0, "rollout_errors": 24, "context_refusals": 24}
    client.get("/status-env", params={"env_id": 0, **counts})
    assert client.get("/status").json()["env_progress"] == {"even_0": counts}
    refused = client.get("/status-env", params={"env_id": 0, "rollout_errors": -1})
    assert refused.status_code == 422 and "rollout_errors" in refused.text
    assert client.get("/status").json()["env_progress"] == {"even_0": counts}


def test_an_env_that_disconnected_and_registers_again_keeps_its_id_and_name(client):
    """A resumed run's environment finds its checkpoints under the name it had; one
    that never disconnected (still running, or killed) does not give its record away."""
    start_trainer(client, batch_size=8)
    first = register_env(client, group_size=4, desired_name="math")
    assert register_env(client, group_size=4, desired_name="math")["wandb_name"] == "math_1"
    client.post("/disconnect-env", json={"env_id": first["env_id"]})
    again = register_env(client, group_size=8, desired_name="math", weight=2.0)
    assert (again["env_id"], again["wandb_name"]) == (0, "math_0")
    assert client.get("/status-env", params={"env_id": 0}).json()["env_weight"] > 0.5
    assert register_env(client, group_size=4, desired_name="math")["wandb_name"] == "math_2"
