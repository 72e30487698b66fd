"""Every test belongs to exactly one tier, and a unit test that leaves the process fails."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from tests.support import tiers
from tests.support.tiers import (
    FIXTURE_TIERS,
    TIERS,
    TierViolation,
    tier_of,
    unit_guard,
)


def test_every_collected_test_has_exactly_one_tier(request):
    """Over the whole session's collection (every tier when the suite runs whole)."""
    items = request.session.items
    assert request.node in items
    untiered = []
    for item in items:
        tiers = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
        if len(tiers) != 1:
            untiered.append(f"{item.nodeid}: {sorted(tiers)}")
    assert not untiered, "\n".join(untiered)


def test_this_module_is_unit_tier(request):
    assert request.node.get_closest_marker("unit") is not None


@dataclass
class FakeItem:
    """What `tier_of` reads of a pytest item."""

    markers: list[str] = field(default_factory=list)
    fixturenames: list[str] = field(default_factory=list)
    nodeid: str = "tests/test_x.py::test_x"
    user_properties: list = field(default_factory=list)

    def iter_markers(self):
        return (getattr(pytest.mark, name).mark for name in self.markers)

    def add_marker(self, marker) -> None:
        self.markers.append(marker.name)


def test_a_tier_comes_from_the_marker_then_the_costliest_fixture_then_unit():
    assert tier_of(FakeItem()) == "unit"
    assert tier_of(FakeItem(fixturenames=["tmp_path", "monkeypatch"])) == "unit"
    assert tier_of(FakeItem(fixturenames=["tmp_path", "tiny_model_path"])) == "integration"
    assert tier_of(FakeItem(fixturenames=["tiny_model_path", "launch"])) == "e2e"
    assert tier_of(FakeItem(markers=["e2e"], fixturenames=["tmp_path"])) == "e2e"
    # a marker can raise the tier its fixtures give, never lower it
    assert tier_of(FakeItem(markers=["e2e", "parametrize"], fixturenames=["api_factory"])) == "e2e"
    assert tier_of(FakeItem(markers=["integration"], fixturenames=["api_factory"])) == (
        "integration"
    )
    assert set(FIXTURE_TIERS.values()) <= set(TIERS)


def test_unit_modules_come_first_then_e2e_ones_then_the_rest_each_in_its_own_order():
    """xdist's loadfile hands modules out in this order: the unit ones while the tiny
    model builds, then the long ones, which must not start last."""
    items = [
        FakeItem(nodeid="tests/test_a.py::test_1"),
        FakeItem(nodeid="tests/test_b.py::test_1", fixturenames=["tiny_model_path"]),
        FakeItem(nodeid="tests/test_b.py::test_2"),
        FakeItem(nodeid="tests/test_c.py::test_1"),
        FakeItem(nodeid="tests/test_c.py::test_2", markers=["e2e"]),
        FakeItem(nodeid="tests/test_d.py::test_1", markers=["e2e"]),
    ]
    tiers.pytest_collection_modifyitems(items)  # the hook, called as pytest calls it
    assert [item.nodeid for item in items] == [
        "tests/test_a.py::test_1",
        "tests/test_c.py::test_1",
        "tests/test_c.py::test_2",
        "tests/test_d.py::test_1",
        "tests/test_b.py::test_1",
        "tests/test_b.py::test_2",
    ]
    assert [item.user_properties for item in items[1:3]] == [[("tier", "unit")], [("tier", "e2e")]]
    assert items[1].markers == ["unit"], "each test keeps its own tier"


def test_two_tier_markers_are_a_collection_error():
    with pytest.raises(pytest.UsageError, match="several tiers"):
        tier_of(FakeItem(markers=["unit", "e2e"]))


def test_a_marker_cheaper_than_the_fixtures_is_a_collection_error():
    with pytest.raises(pytest.UsageError, match=r"marked unit but uses \['tiny_model_path'\]"):
        tier_of(FakeItem(markers=["unit"], fixturenames=["tmp_path", "tiny_model_path"]))
    with pytest.raises(pytest.UsageError, match="which make it e2e"):
        tier_of(FakeItem(markers=["integration"], fixturenames=["launch"]))


def test_the_guard_refuses_a_subprocess_and_names_the_fix():
    with unit_guard("tests/test_x.py::test_x"), pytest.raises(TierViolation) as refused:
        subprocess.run([sys.executable, "-c", "pass"], check=False)
    message = str(refused.value)
    assert "tests/test_x.py::test_x" in message and "started a subprocess" in message
    assert "pytest.mark.integration" in message


def test_the_guard_refuses_an_asyncio_subprocess():
    async def spawn() -> None:
        await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")

    with unit_guard("t"), pytest.raises(TierViolation, match="subprocess"):
        asyncio.run(spawn())


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6])
def test_the_guard_refuses_inet_sockets_loopback_included(family):
    address = ("127.0.0.1", 0) if family == socket.AF_INET else ("::1", 0)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        with unit_guard("t"), pytest.raises(TierViolation, match="inet socket"):
            sock.bind(address)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        with unit_guard("t"), pytest.raises(TierViolation, match="inet socket"):
            sock.connect(address)


def test_the_guard_allows_unix_sockets_and_event_loops():
    """asyncio's self-pipe is a Unix socket pair: an event loop is in-process work."""
    with unit_guard("t"):
        left, right = socket.socketpair()
        left.sendall(b"x")
        assert right.recv(1) == b"x"
        left.close()
        right.close()
        assert asyncio.run(asyncio.sleep(0, result=7)) == 7


def test_the_guard_refuses_a_tiny_model_build(tmp_path):
    pytest.importorskip("torch")
    from atroposlib.utils.tiny_model import TinyModelSpec, build_tiny_model

    with unit_guard("t"), pytest.raises(TierViolation, match="tiny model"):
        build_tiny_model(tmp_path / "m", TinyModelSpec(max_steps=1, corpus_size=10), verify=False)


def test_the_guard_nests_and_restores_the_outer_test():
    from tests.support.tiers import _Guard

    outer = _Guard.active  # this very test's id: it is unit tier
    with unit_guard("inner"):
        assert _Guard.active == "inner"
    assert (
        _Guard.active == outer
        and outer is not None
        and outer.endswith("test_the_guard_nests_and_restores_the_outer_test")
    )
