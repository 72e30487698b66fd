"""The listeners' one guard, called in process: what it counts, and the one refusal
shape that FastAPI clients and the `openai` SDK both read."""

from __future__ import annotations

import asyncio
import json

import pytest

from atroposlib.utils.request_guard import RequestGuard, error_payload, values_and_depth


@pytest.mark.parametrize(
    ("body", "values", "depth"),
    [
        (b"[1, 2, 3]", 4, 1),
        (b"[[[[]]]]", 5, 4),  # a value per bracket, no comma: API-A of the review
        (b'{"a": [1, {"b": [2]}]}', 6, 4),
        (b'["[[[[,,,{{{", "\\"[[["]', 3, 1),  # quoted brackets, commas and escapes: text
        (b"", 1, 0),
    ],
)
def test_values_and_depth_count_structure_not_text(body, values, depth):
    assert values_and_depth(body) == (values, depth)


def test_values_and_depth_bound_what_json_builds():
    for body in (b"[" * 30 + b"]" * 30, b'{"x": [[1, 2], [3, [4, 5]]], "y": "z"}'):
        parsed = json.loads(body)
        built, deepest = 0, 0
        stack = [(parsed, 1)]
        while stack:
            value, level = stack.pop()
            built += 1
            if isinstance(value, (list, dict)):
                deepest = max(deepest, level)
                items = value.values() if isinstance(value, dict) else value
                stack.extend((item, level + 1) for item in items)
        counted, depth = values_and_depth(body)
        assert counted >= built and depth == deepest


def refusal(guard_options: dict, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    """The guard's answer to one POST, and whether the app behind it ran."""
    reached = []

    async def app(scope, receive, send):
        reached.append(scope["path"])

    guard = RequestGuard(app, **{"api_key": None, "max_body_bytes": 1 << 20, **guard_options})
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/x",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    asyncio.run(guard(scope, receive, send))
    if not sent:
        assert reached == ["/x"]
        return 200, {}
    assert reached == [], "a refused request must not reach the app"
    return sent[0]["status"], json.loads(sent[1]["body"])


JSON = {"Content-Type": "application/json", "Host": "127.0.0.1:1"}


@pytest.mark.parametrize(
    ("options", "body", "headers", "status", "words"),
    [
        ({}, b"[]", {"Content-Type": "text/plain", "Host": "127.0.0.1"}, 415, "application/json"),
        ({}, b"[]", {**JSON, "Host": "rebound.example"}, 400, "rebound.example"),
        ({"api_key": "k"}, b"[]", JSON, 401, "Bearer"),
        ({"max_body_values": 10}, b"[" * 11 + b"]" * 11, JSON, 413, "--max-body-values"),
        ({"max_body_depth": 8}, b"[" * 9 + b"]" * 9, JSON, 413, "nests 9 levels"),
        ({"max_body_bytes": 4}, b"[1, 2]", JSON, 413, "--max-body-mb"),
        ({"api_key": "k"}, b"[]", {**JSON, "Sec-Fetch-Site": "cross-site"}, 403, "another"),
        ({}, b"[]", {**JSON, "Sec-Fetch-Site": "same-site"}, 403, "another site's page"),
    ],
)
def test_every_refusal_has_one_shape(options, body, headers, status, words):
    got, payload = refusal(options, body, headers)
    assert got == status and words in payload["detail"]
    assert payload == error_payload(status, payload["detail"])
    assert payload["error"] == {
        "message": payload["detail"],
        "type": "invalid_request_error",
        "code": status,
    }


def test_a_page_the_user_opened_itself_and_a_program_are_answered():
    for site in ("same-origin", "none"):
        assert refusal({}, b"[]", {**JSON, "Sec-Fetch-Site": site})[0] == 200
    assert refusal({}, b"[]", JSON)[0] == 200


def test_a_second_key_opens_only_what_it_is_asked_for():
    def opens(path: str, headers: dict[bytes, bytes]) -> bool:
        return headers.get(b"authorization") == b"Bearer s"

    options = {"api_key": "admin", "also_authorized": opens}
    assert refusal(options, b"{}", {**JSON, "Authorization": "Bearer s"})[0] == 200
    assert refusal(options, b"{}", {**JSON, "Authorization": "Bearer admin"})[0] == 200
    assert refusal(options, b"{}", {**JSON, "Authorization": "Bearer t"})[0] == 401
    assert refusal({"api_key": "admin"}, b"{}", {**JSON, "Authorization": "Bearer s"})[0] == 401
