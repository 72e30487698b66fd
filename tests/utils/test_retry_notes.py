"""A call retried for ever is logged at its first failure, then at a slowing pace, then
once when it answers: never silent, never one line per try."""

from __future__ import annotations

import logging

from atroposlib.utils.retry_notes import RetryNotes

WHAT = "GET /info to the trajectory API at http://127.0.0.1:8000"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def outage(notes: RetryNotes, clock: Clock, seconds: float, every_s: float) -> None:
    """Tries every `every_s` seconds for `seconds`, each failing."""
    start = clock.now
    while clock.now - start <= seconds:
        notes.failed("connection refused", "check that run-api is running")
        clock.now += every_s


def messages(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_an_outage_is_logged_at_a_slowing_pace_then_its_end(caplog):
    clock = Clock()
    notes = RetryNotes(logging.getLogger("test.retry"), WHAT, clock)
    with caplog.at_level(logging.INFO, logger="test.retry"):
        outage(notes, clock, 1000, every_s=2)  # 501 tries over 16 minutes and a bit
        notes.answered()
    warnings = messages(caplog, logging.WARNING)
    assert len(warnings) == 7  # at 0 s, 10 s, 30 s, 1, 2, 5 and 15 minutes
    assert warnings[0] == (
        f"{WHAT} failed (connection refused); check that run-api is running. Retrying"
    )
    assert warnings[1].startswith(f"{WHAT} still fails after 10 s and 6 tries (connection ")
    assert "after 5 min and 151 tries" in warnings[5]
    assert "after 15 min and 451 tries" in warnings[6]
    assert messages(caplog, logging.INFO) == [f"{WHAT} answered after 17 min and 501 failed tries"]


def test_the_next_outage_starts_the_pace_over_and_a_success_alone_says_nothing(caplog):
    clock = Clock()
    notes = RetryNotes(logging.getLogger("test.retry"), WHAT, clock)
    with caplog.at_level(logging.INFO, logger="test.retry"):
        notes.answered()
        assert caplog.records == []
        outage(notes, clock, 40, every_s=5)
        notes.answered()
        outage(notes, clock, 4, every_s=1)
    warnings = messages(caplog, logging.WARNING)
    assert [w.split(" (")[0] for w in warnings] == [
        f"{WHAT} failed",
        f"{WHAT} still fails after 10 s and 3 tries",
        f"{WHAT} still fails after 30 s and 7 tries",
        f"{WHAT} failed",
    ]


def test_rare_tries_are_each_noted_once_not_once_per_note_they_span(caplog):
    clock = Clock()
    notes = RetryNotes(logging.getLogger("test.retry"), WHAT, clock)
    with caplog.at_level(logging.INFO, logger="test.retry"):
        outage(notes, clock, 400, every_s=100)  # tries at 0, 100, 200, 300, 400 s
    lasted = [w.split(" and ")[0].split("after ")[-1] for w in messages(caplog, logging.WARNING)]
    assert lasted[1:] == ["100 s", "3 min", "5 min"]  # 100 s passed the 10, 30 and 60 s notes
