"""Fixtures shared by the server-handling tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.json_standin import JsonStandIn


@pytest.fixture
def standin() -> Iterator:
    """`standin(routes)` starts a JsonStandIn answering `routes`; all stop after the test."""
    made: list[JsonStandIn] = []

    def make(routes):
        made.append(JsonStandIn(routes))
        return made[-1]

    yield make
    for server in made:
        server.close()
