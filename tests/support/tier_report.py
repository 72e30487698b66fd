"""Per-tier totals at the end of a run, and each tier's slowest tests.

`scripts/test.sh` runs the integration and e2e tiers in one pytest session, so that
neither waits for the other's last module on an idle core. pytest's own `--durations`
would then mix the tiers; `--tier-durations N` lists the N slowest tests of each tier
(setup, call and teardown together), which is what docs/testing.md tabulates. The tier
comes from the `tier` property that `tests/support/tiers.py` records on every test, so
it reaches this report from xdist workers and lands in the JUnit file as well.
"""

from __future__ import annotations

from collections import defaultdict

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--tier-durations",
        type=int,
        default=0,
        metavar="N",
        help="after the run, list the N slowest tests of each tier (0: totals only)",
    )


class TierReport:
    def __init__(self, slowest: int) -> None:
        self.slowest = slowest
        self.seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.outcomes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        tier = dict(report.user_properties).get("tier")
        if tier is None:
            return
        self.seconds[tier][report.nodeid] += report.duration
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
            total = sum(times.values())
            write(f"{tier}: {len(times)} tests ({counts}), sum of test times {total:.0f} s")
            ranked = sorted(times.items(), key=lambda kv: -kv[1])[: self.slowest]
            for nodeid, seconds in ranked:
                write(f"  {seconds:7.1f} s  {nodeid}")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TierReport(config.getoption("tier_durations")), "tier-report")
