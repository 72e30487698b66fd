"""Per-tier totals at the end of a run, and each tier's slowest tests.

`scripts/test.sh` runs the integration and e2e tiers in one pytest session, so that
neither waits for the other's last module on an idle core. pytest's own `--durations`
would then mix the tiers; `--tier-durations N` lists the N slowest tests of each tier
(setup, call and teardown together), which is what docs/testing.md tabulates. The tier
comes from the `tier` property that `tests/support/tiers.py` records on every test, so
it reaches this report from xdist workers and lands in the JUnit file as well.

Wall time hides what a test costs the other worker: the suite keeps both cores busy, so
a test that waits is cheap and one that starts processes is not. Each test also records
`cpu_s`, the CPU seconds of its worker and of the processes it started and reaped
(`getrusage`), from its setup to its teardown; the report gives each tier's total and
`--tier-durations` lists the costliest tests by CPU too.
"""

from __future__ import annotations

import resource
from collections import defaultdict
from collections.abc import Iterator

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--tier-durations",
        type=int,
        default=0,
        metavar="N",
        help="after the run, list the N slowest tests of each tier (0: totals only)",
    )


def cpu_seconds() -> float:
    """This process's CPU time and that of every child it has reaped."""
    usage = (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return sum(u.ru_utime + u.ru_stime for u in usage)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    item.stash[CPU_AT_SETUP] = cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield  # the teardown report, made after this, carries the property
    if CPU_AT_SETUP in item.stash:
        item.user_properties.append(("cpu_s", round(cpu_seconds() - item.stash[CPU_AT_SETUP], 2)))


CPU_AT_SETUP = pytest.StashKey[float]()


class TierReport:
    def __init__(self, slowest: int) -> None:
        self.slowest = slowest
        self.seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.outcomes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.cpu: dict[str, dict[str, float]] = defaultdict(dict)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        properties = dict(report.user_properties)
        tier = properties.get("tier")
        if tier is None:
            return
        self.seconds[tier][report.nodeid] += report.duration
        if report.when == "teardown" and "cpu_s" in properties:
            self.cpu[tier][report.nodeid] = float(properties["cpu_s"])
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.outcomes[tier][report.outcome] += 1
        elif report.when == "teardown" and report.failed:
            self.outcomes[tier]["error"] += 1

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.seconds:
            return
        write = terminalreporter.write_line
        terminalreporter.section("tiers")
        for tier in ("unit", "integration", "e2e"):
            if tier not in self.seconds:
                continue
            times = self.seconds[tier]
            outcomes = sorted(self.outcomes[tier].items())
            counts = ", ".join(f"{n} {outcome}" for outcome, n in outcomes)
            total, cpu = sum(times.values()), self.cpu[tier]
            write(
                f"{tier}: {len(times)} tests ({counts}), sum of test times {total:.0f} s, "
                f"CPU {sum(cpu.values()):.0f} s"
            )
            for nodeid, seconds in sorted(times.items(), key=lambda kv: -kv[1])[: self.slowest]:
                write(f"  {seconds:7.1f} s  {nodeid}")
            if self.slowest and cpu:
                write(f"{tier}, the costliest by CPU (the worker and the processes it reaped):")
            for nodeid, seconds in sorted(cpu.items(), key=lambda kv: -kv[1])[: self.slowest]:
                write(f"  {seconds:7.1f} s CPU  {nodeid}")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TierReport(config.getoption("tier_durations")), "tier-report")
