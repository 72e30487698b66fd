"""The OpenAPI document is the contract: schemathesis fuzzes the API's app from it.

Every operation is driven from `/openapi.json` with schemathesis's every check
(examples, coverage and fuzzing phases; positive and negative data), once against an
app without a key and once with `api_key`. The app is `run-api`'s own `create_app`,
served in-process through schemathesis's ASGI transport (one lifespan per app, so the
real SQLite store serves every call); uvicorn and auth over a socket are tested in
test_uvicorn_target.py and test_auth.py. The fuzzing runs in the integration tier (its
CPU, about 25 s a key mode, would be a third of the unit tier's); the checks of the 401s,
the JSON types and the content types stay in the unit tier. A failure means the app
answered something its document does not promise: fix the app or the document, never
the checks.

One aid to generation, not to judging: JSON Schema cannot say "as many masks as
token rows" or "no longer than the registered max_token_len", so `_consistent_groups`
shapes the *positive* scored-data bodies to those rules (the document states them in
words). Negative bodies go out as generated.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import schemathesis

# `.specs.openapi.schemas`: what `from_asgi` imports lazily, imported at collection. On
# CPython before 3.11.8 two `ast.parse` calls at once can raise SystemError
# (gh-106905), and pytest's rewriting of this plugin's module on a test's first call
# raced another thread's parse in a worker (a fresh clone of 7b1fde9)
import schemathesis.specs.openapi.schemas
from schemathesis import GenerationMode
from schemathesis.engine import Status, events, from_schema
from schemathesis.python import asgi

from atroposlib.api.server import create_app
from atroposlib.api.settings import APISettings
from atroposlib.protocol import LOGPROB_FIELDS, PER_SEQUENCE_FIELDS, PER_TOKEN_FIELDS

API_KEY = "fuzz-key"
MAX_EXAMPLES = 25
ALL_CHECKS = {
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
    "positive_data_acceptance",
    "negative_data_rejection",
    "missing_required_header",
    "unsupported_method",
    "allow_header_conformance",
    "ignored_auth",
    "use_after_free",
    "ensure_resource_availability",
    "object_level_authorization",
}
"""Every check schemathesis has (`max_response_time` needs a limit, which this leaves out)."""
OPEN_PATHS = {"/", "/health"}
GROUP_ROUTES = {"/scored_data", "/scored_data_list"}


@dataclass
class Served:
    app: Any
    headers: dict[str, str]
    keyed: bool

    @contextmanager
    def client(self, authorized: bool = True) -> Iterator[asgi.ASGIClient]:
        """A requests-style client of the app that shares schemathesis's one lifespan."""
        with asgi.get_client(self.app) as client:
            if authorized:
                client.headers.update(self.headers)
            yield client


@pytest.fixture(scope="module", params=["no-key", "api-key"])
def served(request: pytest.FixtureRequest, tmp_path_factory) -> Served:
    keyed = request.param == "api-key"
    state_dir = tmp_path_factory.mktemp(f"fuzz-{request.param}") / "state"
    settings = APISettings(
        state_dir=str(state_dir),
        api_key=API_KEY if keyed else None,
        allowed_hosts=["testserver"],  # the Host schemathesis's ASGI client sends
    )
    headers = {"Authorization": f"Bearer {API_KEY}"} if keyed else {}
    # a request that crashes the app is a 500, which the not_a_server_error check fails
    return Served(create_app(settings), headers, keyed)


def _fit(values: Any, length: int, filler: Any) -> list:
    values = values if isinstance(values, list) else []
    return values[:length] + [filler] * (length - len(values[:length]))


def _at_most_zero(value: Any) -> Any:
    return (
        min(value, 0.0) if isinstance(value, int | float) and not isinstance(value, bool) else value
    )


def _consistent(group: Any, limit: int) -> Any:
    """`group` with the cross-field rules of `atroposlib.protocol.group_problems` met."""
    if not isinstance(group, dict) or not isinstance(group.get("tokens"), list):
        return group
    tokens = [row[:limit] if limit > 0 else row for row in group["tokens"]]
    n, lengths = len(tokens), [len(row) for row in tokens]
    group["tokens"] = tokens
    group["masks"] = [
        _fit(m, k, -100) for m, k in zip(_fit(group.get("masks"), n, []), lengths, strict=True)
    ]
    group["scores"] = _fit(group.get("scores"), n, 0.0)
    for name in PER_SEQUENCE_FIELDS:
        value = group.get(name)
        if not isinstance(value, list) or (name == "messages" and value == []):
            continue  # absent, null, or upstream's "no conversation"
        if name in DISTILL_FIELDS:
            continue  # both together, below
        if name in PER_TOKEN_FIELDS:
            rows = _fit(value, n, [])
            group[name] = [_fit(row, k, 0.0) for row, k in zip(rows, lengths, strict=True)]
            if name in LOGPROB_FIELDS:  # a log-probability is at most 0 where a token trains
                group[name] = [
                    [_at_most_zero(v) if m != -100 and j else v for j, (v, m) in enumerate(pair)]
                    for pair in (
                        zip(row, mask, strict=True)
                        for row, mask in zip(group[name], group["masks"], strict=True)
                    )
                ]
        else:
            group[name] = _fit(value, n, {} if name == "overrides" else [])
    _consistent_teacher(group, lengths)
    group["env_id"] = None  # an env the fuzzer registered may be gone after /reset_data
    return group


DISTILL_FIELDS = ("distill_token_ids", "distill_logprobs")


def _consistent_teacher(group: dict, lengths: list[int]) -> None:
    """The teacher's arrays, when both are lists: a row per token, as many logprobs as
    ids at each position, ids >= 0, and log-probabilities at most 0 (everywhere: the
    masks' trained positions are what the rule reads)."""
    ids, logprobs = (group.get(name) for name in DISTILL_FIELDS)
    n = len(lengths)
    if not (isinstance(ids, list) and isinstance(logprobs, list)):
        for name in DISTILL_FIELDS:  # one alone: only its sequence count is checked
            if isinstance(group.get(name), list):
                group[name] = _fit(group[name], n, [])
        return
    ids_out, logprobs_out = [], []
    for seq_ids, seq_lps, k in zip(_fit(ids, n, []), _fit(logprobs, n, []), lengths, strict=True):
        rows = list(zip(_fit(seq_ids, k, []), _fit(seq_lps, k, []), strict=True))
        ids_out.append(
            [
                [abs(t) if isinstance(t, int) else 0 for t in _fit(r, len(r), 0)]
                if isinstance(r, list)
                else []
                for r, _ in rows
            ]
        )
        logprobs_out.append(
            [
                [_at_most_zero(v) for v in _fit(lp, len(r) if isinstance(r, list) else 0, 0.0)]
                for r, lp in rows
            ]
        )
    group["distill_token_ids"], group["distill_logprobs"] = ids_out, logprobs_out


def _consistent_groups(served: Served):
    """A `map_case` hook: positive scored-data bodies that meet the cross-field rules."""

    def map_case(context: schemathesis.HookContext, case: schemathesis.Case) -> Any:
        positive = case.meta is not None and case.meta.generation.mode == GenerationMode.POSITIVE
        if positive and case.operation.path == "/register" and isinstance(case.body, dict):
            # a trainer's vocabulary bounds every token id posted after it; a random one
            # (1, say) would make the fuzzer's schema-valid groups invalid
            case.body.pop("vocab_size", None)
        if not positive or case.operation.path not in GROUP_ROUTES:
            return case
        with served.client() as client:
            info = client.get("/info").json()
        limit = info["max_token_len"]
        if isinstance(case.body, list):
            case.body = [_consistent(group, limit) for group in case.body]
        else:
            case.body = _consistent(case.body, limit)
        return case

    return map_case


def _load_schema(served: Served) -> schemathesis.BaseSchema:
    config = schemathesis.Config()  # defaults, not a schemathesis.toml in the working directory
    schema = schemathesis.openapi.from_asgi(
        "/openapi.json", served.app, config=config, headers=served.headers
    )
    schema.config.update(headers=served.headers, request_timeout=30)
    schema.config.generation.update(max_examples=MAX_EXAMPLES, deterministic=True)
    schema.hook("map_case")(_consistent_groups(served))
    return schema


@dataclass
class FuzzRun:
    failures: list[str] = field(default_factory=list)
    scenarios: set[tuple[str, str]] = field(default_factory=set)  # (phase, operation)
    checks: set[str] = field(default_factory=set)
    cases: int = 0


def _fuzz(schema: schemathesis.BaseSchema) -> FuzzRun:
    """Every phase with every check, as `schemathesis run --checks all` runs them."""
    run = FuzzRun()
    for event in from_schema(schema).execute():
        if isinstance(event, events.NonFatalError):
            run.failures.append(f"{event.label}: schemathesis error: {event.value!r}")
        elif isinstance(event, events.FatalError):
            run.failures.append(f"schemathesis stopped: {event.exception!r}")
        elif isinstance(event, events.PhaseFinished) and event.status == Status.ERROR:
            run.failures.append(f"phase {event.phase.name} errored")
        elif isinstance(event, events.ScenarioFinished):
            label = event.recorder.label
            run.scenarios.add((event.phase.value, label))
            run.cases += len(event.recorder.cases)
            if event.status == Status.ERROR:
                run.failures.append(f"{label}: the {event.phase.value} scenario errored")
            for nodes in event.recorder.checks.values():
                for node in nodes:
                    run.checks.add(node.name)
                    if node.failure_info is not None:
                        failure = node.failure_info.failure
                        run.failures.append(
                            f"{label} [{node.name}] {failure.title}\n{failure.message}\n"
                            f"{node.failure_info.code_sample}"
                        )
    return run


@pytest.mark.integration  # in-process, but 25 s of CPU a key mode: keeps the unit tier quick
def test_every_operation_keeps_to_the_document(served: Served):
    schema = _load_schema(served)
    paths = schema.raw_schema["paths"]
    operations = {f"{method.upper()} {path}" for path, item in paths.items() for method in item}
    assert len(operations) >= 15
    run = _fuzz(schema)
    assert not run.failures, "\n\n".join(run.failures)
    for phase in ("coverage", "fuzzing"):
        ran = {operation for name, operation in run.scenarios if name == phase}
        assert ran == operations, (phase, operations ^ ran)
    assert ALL_CHECKS <= run.checks, ALL_CHECKS - run.checks
    assert run.cases > 10 * len(operations)


def test_without_the_key_every_guarded_route_answers_a_documented_401(served: Served):
    with served.client() as client:
        document = client.get("/openapi.json").json()
    assert ("bearer" in document.get("components", {}).get("securitySchemes", {})) is served.keyed
    operations = [
        (method.upper(), path, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
    ]
    assert len(operations) >= 15
    for method, path, operation in operations:
        with served.client(authorized=False) as client:
            answer = client.request(method, path)
        guarded = served.keyed and path not in OPEN_PATHS
        if guarded:
            assert answer.status_code == 401, (method, path, answer.text)
            assert answer.headers["www-authenticate"] == "Bearer"
            assert "Authorization: Bearer" in answer.json()["detail"]
        else:
            assert answer.status_code != 401, (method, path, answer.text)
        assert ("401" in operation["responses"]) is guarded, (method, path)
        assert str(answer.status_code) in operation["responses"], (method, path, answer.text)


def test_wrong_json_types_are_refused_not_coerced(served: Served):
    """A JSON bool is not an int and a string not a number; 3.0 is the integer 3."""
    registration = {
        "wandb_group": "g",
        "wandb_project": "p",
        "batch_size": 4,
        "max_token_len": 16,
        "checkpoint_dir": "c",
        "save_checkpoint_interval": 1,
        "starting_step": 0,
        "num_steps": 3,
    }
    with served.client() as client:
        assert client.post("/reset_data", json={}).text == "Reset successful"
        for field, wrong in (("num_steps", False), ("batch_size", "4"), ("wandb_group", 1)):
            answer = client.post("/register", json={**registration, field: wrong})
            assert answer.status_code == 422, answer.text
            assert [e["loc"] for e in answer.json()["detail"]] == [["body", field]]
        answer = client.post("/disconnect-env", json={"env_id": False})
        assert answer.status_code == 422, answer.text
        assert client.post("/register", json={**registration, "num_steps": 3.0}).status_code == 200
        client.get("/batch")  # the trainer has started: envs may register
        env = {"max_token_length": 16, "desired_name": "e", "weight": 2, "group_size": 2}
        assert client.post("/register-env", json=env).json()["status"] == "success"
        refused = client.post("/register-env", json={**env, "weight": True})
        assert refused.status_code == 422, refused.text
        group = {"tokens": [[1, 2.0], [3, 4]], "masks": [[1, 1], [1, 1]], "scores": [1.0, 0]}
        assert client.post("/scored_data", json=group).json() == {"status": "received"}
        for wrong_token in (True, "5", 2.5):
            bad = {**group, "tokens": [[1, wrong_token], [3, 4]]}
            assert client.post("/scored_data", json=bad).status_code == 422
        client.post("/scored_data", json={**group, "tokens": [[5, 6], [7, 8]]})
        batch = client.get("/batch").content
        # the whole number 2.0 reaches the trainer as the integer it is
        assert b'"tokens":[[1,2],[3,4]]' in batch.replace(b" ", b""), batch


def test_the_document_declares_every_content_type(served: Served):
    with served.client() as client:
        document = client.get("/openapi.json").json()
    paths = document["paths"]
    assert set(paths["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    for method in ("get", "post"):
        reset = paths["/reset_data"][method]["responses"]["200"]["content"]
        assert set(reset) == {"text/plain"}
    for route in GROUP_ROUTES:
        body = paths[route]["post"]["requestBody"]
        assert body["required"] is True
        schema = body["content"]["application/json"]["schema"]
        group = schema["items"] if route == "/scored_data_list" else schema
        assert {"tokens", "masks", "scores"} <= set(group["properties"])
    with served.client() as client:
        assert client.get("/metrics").headers["content-type"].startswith("text/plain")
        assert client.post("/reset_data", json={}).headers["content-type"].startswith("text/plain")
