"""Bad input gets a 4xx naming the problem; nothing makes the server answer 500."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.groups import REGISTRATION, make_group, register_env, start_trainer
from tests.support.inprocess_api import inprocess_api


@pytest.fixture
def client(tmp_path) -> Iterator[httpx.Client]:
    with inprocess_api(tmp_path / "state", max_body_mb=0.25) as c:
        start_trainer(c, batch_size=4, max_token_len=16)
        register_env(c, group_size=2)
        yield c


def locs(response: httpx.Response) -> list[list]:
    assert response.status_code == 422, response.text
    return [error["loc"] for error in response.json()["detail"]]


def post(client: httpx.Client, group: dict, path: str = "/scored_data") -> httpx.Response:
    return client.post(path, json=group)


JSON = {"content-type": "application/json"}


def test_malformed_json(client):
    headers = {"content-type": "application/json"}
    assert client.post("/scored_data", content=b"{tokens: [", headers=headers).status_code == 422
    assert client.post("/register", content=b"[1,", headers=headers).status_code == 422
    assert client.post("/scored_data", content=b"", headers=headers).status_code == 422


def test_wrong_types_name_the_field(client):
    group = make_group(2)
    group["tokens"][0][1] = "seven"
    assert ["body", "tokens", 0, 1] in locs(post(client, group))
    group = make_group(2)
    group["scores"] = "high"
    assert ["body", "scores"] in locs(post(client, group))
    group = make_group(2)
    group["tokens"][1][0] = 1.5
    assert ["body", "tokens", 1, 0] in locs(post(client, group))
    assert ["body", "tokens"] in locs(post(client, {"masks": [[1]], "scores": [1.0]}))


def test_shapes_must_agree(client):
    group = make_group(2)
    group["masks"][1] = group["masks"][1][:-1]
    assert locs(post(client, group)) == [["body", "masks", 1]]
    group = make_group(2)
    group["masks"] = group["masks"][:1]
    assert ["body", "masks"] in locs(post(client, group))
    group = make_group(2)
    group["scores"] = [1.0]
    assert locs(post(client, group)) == [["body", "scores"]]
    group = make_group(2)
    group["advantages"] = [[0.0] * 4]
    assert locs(post(client, group)) == [["body", "advantages"]]
    group = make_group(2)
    group["inference_logprobs"] = [[0.0] * 4] * 3
    assert locs(post(client, group)) == [["body", "inference_logprobs"]]
    assert ["body", "tokens"] in locs(post(client, {"tokens": [], "masks": [], "scores": []}))


@pytest.mark.parametrize("field", ["advantages", "inference_logprobs", "ref_logprobs"])
def test_per_token_fields_match_each_sequence_length(client, field):
    """A per-token list of another length would be broadcast or crash the trainer."""
    group = make_group(2)  # two sequences of 4 tokens
    group[field] = [[-0.5] * 4, [-0.5, -0.7]]
    response = post(client, group)
    assert locs(response) == [["body", field, 1]]
    assert field in response.text and "2" in response.text and "4" in response.text
    group[field] = [[-0.5] * 4, [-0.5] * 5]
    assert locs(post(client, group)) == [["body", field, 1]]
    group[field] = [[-0.5] * 4, [-0.5] * 4]
    assert post(client, group).status_code == 200


def test_scores_must_be_finite(client):
    body = '{"tokens": [[1], [2]], "masks": [[1], [2]], "scores": [NaN, 1.0]}'
    response = client.post(
        "/scored_data", content=body, headers={"content-type": "application/json"}
    )
    assert locs(response) == [["body", "scores", 0]]
    body = body.replace("NaN", "-Infinity")
    response = client.post(
        "/scored_data", content=body, headers={"content-type": "application/json"}
    )
    assert locs(response) == [["body", "scores", 0]]


def test_messages_need_role_and_content(client):
    group = make_group(2)
    group["messages"] = [[{"role": "user", "content": "x"}], [{"content": "no role"}]]
    assert locs(post(client, group)) == [["body", "messages", 1, 0]]


def test_empty_messages_list_is_accepted_and_passed_on(client):
    """Upstream's SFT clients send `messages: []`; a non-empty list must still fit."""
    for tag in (1, 2):
        group = make_group(2, tag=tag)
        group["messages"] = []
        assert post(client, group).json() == {"status": "received"}
    batch = client.get("/batch").json()["batch"]
    assert [g["messages"] for g in batch] == [[], []]
    short = make_group(2)
    short["messages"] = [[{"role": "user", "content": "x"}]]
    assert locs(post(client, short)) == [["body", "messages"]]


def test_unknown_env_and_over_long_sequences(client):
    assert locs(post(client, make_group(2, env_id=7))) == [["body", "env_id"]]
    assert ["body", "env_id"] in locs(post(client, make_group(2, env_id=-1)))
    response = post(client, make_group(2, length=17))
    assert locs(response) == [["body", "tokens", 0], ["body", "tokens", 1]]
    assert "max_token_len 16" in response.text
    assert post(client, make_group(2, length=16)).status_code == 200


def test_a_bad_group_in_a_list_rejects_the_whole_list(client):
    bad = make_group(2)
    bad["scores"] = [1.0]
    response = post(client, [make_group(2, tag=1), bad], path="/scored_data_list")
    assert locs(response) == [["body", 1, "scores"]]
    assert client.get("/status").json()["queue_size"] == 0
    assert locs(post(client, {"not": "a list"}, path="/scored_data_list")) == [["body"]]


def test_registration_validation(client):
    assert ["body", "batch_size"] in locs(client.post("/register", json={"batch_size": 0}))
    bad_env = {
        "max_token_length": 1,
        "desired_name": "x",
        "weight": 1,
        "group_size": 2,
        "min_batch_allocation": 1.5,
    }
    assert ["body", "min_batch_allocation"] in locs(client.post("/register-env", json=bad_env))
    assert ["body", "env_id"] in locs(client.post("/disconnect-env", json={"env_id": "x"}))


def test_environment_registrations_are_bounded(client):
    """API-6: a 30 MB name was stored and rewritten on every later registration, and an
    infinite weight or a negative length pushed every other env to the weight floor."""
    good = {"max_token_length": 64, "desired_name": "env", "weight": 1.0, "group_size": 2}
    for field, bad in (
        ("desired_name", "x" * 257),
        ("desired_name", ""),
        ("weight", 1e7),
        ("weight", -1.0),
        ("max_token_length", -5),
    ):
        answer = client.post("/register-env", json={**good, field: bad})
        assert ["body", field] in locs(answer), (field, answer.text)
    infinite = '{"max_token_length": 64, "desired_name": "e", "weight": Infinity, "group_size": 2}'
    answer = client.post("/register-env", content=infinite, headers=JSON)
    assert answer.status_code == 422, answer.text
    assert client.post("/register-env", json={**good, "desired_name": "x" * 256}).is_success
    for field, bad in (("wandb_group", "g" * 257), ("checkpoint_dir", "/" + "d" * 4096)):
        answer = client.post("/register", json={**REGISTRATION, field: bad})
        assert ["body", field] in locs(answer), (field, answer.text)


def test_status_env_errors(client):
    assert client.get("/status-env", params={"env_id": 3}).status_code == 404
    assert client.get("/status-env").status_code == 422
    assert client.get("/status-env", params={"env_id": "zero"}).status_code == 422
    response = client.request(
        "GET", "/status-env", content=b"{oops", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422


def test_oversize_bodies_get_413(client):
    big = make_group(2, length=16)
    big["generation_params"] = {"padding": "x" * 400_000}
    assert post(client, big).status_code == 413
    bomb = gzip.compress(b"[" + b"0," * 2_000_000 + b"0]")
    assert len(bomb) < 0.25 * 2**20
    headers = {"content-encoding": "gzip", "content-type": "application/json"}
    response = client.post("/scored_data_list", content=bomb, headers=headers)
    assert response.status_code == 413 and "max-body-mb" in response.text
    assert post(client, make_group(2)).status_code == 200  # still serving


def test_a_body_is_refused_on_its_value_count_before_it_is_parsed(tmp_path, monkeypatch):
    """API-7: a small gzip post expanded to 100 MB of token ids and peaked at 1.8 GB of
    Python objects before the 422; the count of values is now checked on the raw bytes."""
    import atroposlib.api.routes as routes  # where the route reads the posted bytes

    parsed = []
    real = routes.read_groups_json
    monkeypatch.setattr(
        routes, "read_groups_json", lambda *a, **k: parsed.append(1) or real(*a, **k)
    )
    with inprocess_api(tmp_path / "state", max_body_values=1000) as c:
        start_trainer(c, batch_size=4, max_token_len=16)
        register_env(c, group_size=2)
        bomb = gzip.compress(json.dumps(make_group(2, length=600)).encode())
        headers = {"content-encoding": "gzip", "content-type": "application/json"}
        response = c.post("/scored_data", content=bomb, headers=headers)
        assert response.status_code == 413 and "--max-body-values" in response.text
        assert parsed == []  # refused before json built anything
        assert post(c, make_group(2)).status_code == 200
        assert parsed == [1]


def test_a_nested_list_post_is_refused_before_it_is_parsed_at_the_default_limits(
    tmp_path, monkeypatch
):
    """API-A of the security review: `[[[...]]]` holds a value per bracket and no comma,
    so a 71 KiB gzip post took run-api to 1.49 GB under --max-body-values 8M. Brackets
    count now: the review's own body is refused before any parser, within 200 MiB."""
    import tracemalloc

    import atroposlib.api.routes as routes

    parsed = []
    real = routes.read_groups_json
    monkeypatch.setattr(
        routes, "read_groups_json", lambda *a, **k: parsed.append(1) or real(*a, **k)
    )
    chunk = b"[" * 150 + b"]" * 150
    count = (16 << 20) // (len(chunk) + 1)
    body = (
        b'{"tokens": [[1, 2]], "masks": [[1, 2]], "scores": [1.0], "images": ['
        + b",".join([chunk] * count)
        + b"]}"
    )
    bomb = gzip.compress(body)
    assert len(bomb) < 80 << 10, "the review's 71 KiB post"
    with inprocess_api(tmp_path / "state") as c:  # run-api's default limits
        start_trainer(c, batch_size=4, max_token_len=16)
        register_env(c, group_size=2)
        headers = {"content-encoding": "gzip", "content-type": "application/json"}
        tracemalloc.start()
        try:
            response = c.post("/scored_data", content=bomb, headers=headers)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert response.status_code == 413 and "--max-body-values" in response.text
        assert parsed == [] and peak < 200 << 20, peak
        deep = json.dumps(make_group(2))[:-1] + ', "images": ' + "[" * 80 + "]" * 80 + "}"
        refused = c.post("/scored_data", content=deep, headers=JSON)
        assert refused.status_code == 413 and "nests 81 levels" in refused.text
        assert parsed == [] and post(c, make_group(2)).status_code == 200


ENDPOINTS = [
    ("POST", "/register"),
    ("POST", "/register-env"),
    ("POST", "/disconnect-env"),
    ("POST", "/scored_data"),
    ("POST", "/scored_data_list"),
    ("GET", "/status-env"),
    ("GET", "/batch"),
    ("GET", "/status"),
    ("GET", "/info"),
    ("GET", "/latest_example"),
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
field_names = st.sampled_from(
    [
        "tokens",
        "masks",
        "scores",
        "env_id",
        "messages",
        "advantages",
        "batch_size",
        "group_size",
        "max_token_length",
        "desired_name",
        "weight",
        "min_batch_allocation",
        "inference_logprobs",
    ]
)
payloads = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(field_names, json_values, max_size=6).map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=64),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(endpoint=st.sampled_from(ENDPOINTS), payload=payloads)
def test_no_input_makes_the_server_fail(client, endpoint, payload):
    method, path = endpoint
    response = client.request(
        method, path, content=payload, headers={"content-type": "application/json"}
    )
    assert response.status_code < 500, (path, payload, response.text)


@pytest.mark.parametrize("payload", [b"Infinity", b"-Infinity", b'{"batch_size": NaN}'])
@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_non_finite_json_is_a_client_error(client, endpoint, payload):
    """Python's json reads NaN/Infinity; echoing them back must not break the 422 answer."""
    method, path = endpoint
    response = client.request(
        method, path, content=payload, headers={"content-type": "application/json"}
    )
    assert response.status_code < 500, (path, payload, response.text)
    if response.status_code == 422:
        assert response.json()["detail"]
