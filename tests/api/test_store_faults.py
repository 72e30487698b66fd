"""A store that cannot write (disk full, read-only, I/O error) is a 503, never corruption.

Faults are injected in-process: `FullDisk` makes every `SQLiteStore` write raise
SQLite's own disk-full error while it is set, and the answers of the app (served
in-process) are checked exactly. `test_disk_full.py` does the same on a real full disk.
"""

from __future__ import annotations

import errno
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from atroposlib.api.refusals import StoreWriteError
from atroposlib.api.segments import SegmentLog
from atroposlib.api.state import RunState
from atroposlib.api.store import GroupRow, SQLiteStore, WriteSet, fault_kind, write_failure
from atroposlib.protocol import RegisterEnv, Registration, ScoredData
from tests.support.groups import (
    REGISTRATION,
    drain_batches,
    make_group,
    register_env,
    start_trainer,
    tags_of,
)
from tests.support.inprocess_api import inprocess_api

REASON = "the API's disk is full: database or disk is full"
DETAIL = {"detail": f"{REASON}; retry later"}
RETRY_AFTER = 7


class FullDisk:
    """While `full`, every write method of `SQLiteStore` raises SQLITE_FULL's error."""

    WRITES = ("write", "remove", "lease", "reset", "prune_idempotency")

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        self.refused = 0
        for name in self.WRITES:
            monkeypatch.setattr(SQLiteStore, name, self._failing(getattr(SQLiteStore, name)))

    def _failing(self, original):
        def method(store: SQLiteStore, *args: Any, **kwargs: Any) -> Any:
            if self.full:
                self.refused += 1
                raise sqlite3.OperationalError("database or disk is full")
            return original(store, *args, **kwargs)

        return method


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> FullDisk:
    return FullDisk(monkeypatch)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[httpx.Client]:
    with inprocess_api(tmp_path / "state", retry_after_s=RETRY_AFTER) as c:
        yield c


def assert_refused(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.json() == DETAIL
    assert response.headers["retry-after"] == str(RETRY_AFTER)


def metric(client: httpx.Client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[-1])
    raise AssertionError(f"/metrics has no {name}")


def test_posts_on_a_full_disk_get_503_and_are_accepted_once_it_has_room(client, disk):
    start_trainer(client, batch_size=8)
    register_env(client, group_size=4)
    assert client.post("/scored_data", json=make_group(4, tag=1, env_id=0)).status_code == 200

    disk.full = True
    assert_refused(client.post("/scored_data", json=make_group(4, tag=2, env_id=0)))
    pair = [make_group(4, tag=3, env_id=0), make_group(4, tag=4, env_id=0)]
    assert_refused(client.post("/scored_data_list", json=pair))
    keyed = {"json": make_group(2, tag=5, env_id=0), "headers": {"Idempotency-Key": "k5"}}
    assert_refused(client.post("/scored_data", **keyed))
    assert disk.refused == 3

    status = client.get("/status").json()
    assert status["queue_size"] == 1 and status["buffered_groups"] == 0
    assert status["current_step"] == 0 and status["store_error"] == REASON
    assert client.get("/health").json()["status"] == "ok"
    assert metric(client, "atropos_store_write_errors_total") == 3
    assert metric(client, "atropos_store_error") == 1
    assert metric(client, 'atropos_rejected_requests_total{reason="store_error"}') == 3

    disk.full = False
    ok = client.post("/scored_data", json=make_group(4, tag=2, env_id=0))
    assert ok.json() == {"status": "received"}
    ok = client.post("/scored_data_list", json=pair)
    assert ok.json() == {"status": "received", "groups_processed": 2}
    # the refused keyed post left no answer behind: its retry is accepted, then replayed
    buffered = {"status": "buffered", "buffer_size": 2}
    assert client.post("/scored_data", **keyed).json() == buffered
    assert client.post("/scored_data", **keyed).json() == buffered
    status = client.get("/status").json()
    assert status["store_error"] is None and status["buffered_groups"] == 1
    assert metric(client, "atropos_store_error") == 0
    assert [tags_of(batch) for batch in drain_batches(client)] == [[1, 2], [3, 4]]


def test_batch_that_cannot_commit_is_503_and_the_same_batch_comes_next(client, disk):
    start_trainer(client, batch_size=8)
    for tag in range(1, 7):
        client.post("/scored_data", json=make_group(4, tag=tag))

    disk.full = True  # upstream's destructive read
    assert_refused(client.get("/batch"))
    assert client.get("/status").json()["current_step"] == 0
    disk.full = False
    assert tags_of(client.get("/batch").json()["batch"]) == [1, 2]

    disk.full = True  # a leased step
    assert_refused(client.get("/batch", params={"step": 2}))
    status = client.get("/status").json()
    assert (status["current_step"], status["queue_size"], status["kept_batch_steps"]) == (1, 4, [])
    disk.full = False
    assert tags_of(client.get("/batch", params={"step": 2}).json()["batch"]) == [3, 4]

    disk.full = True  # releasing a checkpointed step fails: it stays kept
    assert_refused(client.get("/batch", params={"step": 3, "committed": 2}))
    status = client.get("/status").json()
    assert (status["current_step"], status["kept_batch_steps"]) == (2, [2])
    disk.full = False
    answer = client.get("/batch", params={"step": 3, "committed": 2}).json()
    assert tags_of(answer["batch"]) == [5, 6]
    assert client.get("/status").json()["kept_batch_steps"] == [3]


def test_registration_on_a_full_disk_is_503_and_changes_nothing(client, disk):
    disk.full = True
    assert_refused(client.post("/register", json=REGISTRATION))
    assert client.get("/status").json() == {
        "current_step": 0,
        "queue_size": 0,
        "store_error": REASON,
    }
    assert client.get("/info").json() == {"batch_size": -1, "max_token_len": -1}
    disk.full = False
    start_trainer(client)
    disk.full = True
    env = {"max_token_length": 64, "desired_name": "env", "weight": 1.0, "group_size": 4}
    assert_refused(client.post("/register-env", json=env))
    disk.full = False
    assert register_env(client)["wandb_name"] == "env_0"  # the refused one left no trace


def snapshot(state: RunState) -> dict[str, Any]:
    """What must match between memory and the store (counters and timings aside)."""
    return {
        "registration": state.registration,
        "started": state.batches.started,
        "step": state.batches.step,
        "queue": [(r.id, r.size) for r in state.batches.queue],
        "buffers": {env: [r.id for r in rows] for env, rows in state.buffers.items() if rows},
        "leases": {step: [r.id for r in rows] for step, rows in state.batches.leases.items()},
        "envs": state.envs.as_json(),
        "next_id": state.next_id,
        "sequences": (state.batches.queued_sequences, state.buffered_sequences),
        "idempotency": sorted(state.idempotency.answers),
    }


def groups(*specs: tuple[int, int, int | None]) -> list[ScoredData]:
    return [
        ScoredData.model_validate(make_group(size, tag=tag, env_id=env)) for size, tag, env in specs
    ]


def test_every_refused_write_leaves_memory_equal_to_the_store(tmp_path, disk):
    state = RunState(SQLiteStore(tmp_path))
    registration = Registration.model_validate(REGISTRATION)
    env = RegisterEnv(max_token_length=64, desired_name="env", weight=1.0, group_size=4)

    def refused(call) -> None:
        before = snapshot(state)
        disk.full = True
        with pytest.raises(StoreWriteError, match="disk is full"):
            call()
        disk.full = False
        assert snapshot(state) == before

    refused(lambda: state.register(registration))
    state.register(registration)
    refused(state.next_batch)
    state.next_batch()
    refused(lambda: state.register_env(env))
    state.register_env(env)
    state.accept(groups((2, 1, 0)), as_list=False)
    refused(lambda: state.accept(groups((2, 2, 0)), as_list=False, idempotency_key="a"))
    refused(lambda: state.accept(groups((4, 3, 0), (2, 4, 0), (4, 5, None)), as_list=True))
    state.accept(groups((4, 3, 0), (4, 4, 0), (4, 5, 0), (4, 6, 0)), as_list=True)
    refused(lambda: state.next_batch(step=1))
    assert tags_of(json_batch(state.next_batch(step=1))) == [3, 4]
    refused(lambda: state.next_batch(step=2, committed=1))
    refused(lambda: state.disconnect_env(0))
    refused(lambda: state.register(registration.model_copy(update={"starting_step": 1})))
    refused(state.reset)
    assert state.store_error == REASON

    kept = snapshot(state)
    assert kept["leases"] == {1: [2, 3]} and kept["buffers"] == {0: [1]}
    state.store.close()
    assert snapshot(RunState(SQLiteStore(tmp_path))) == kept


def json_batch(answer: bytes | dict[str, Any]) -> list[dict[str, Any]]:
    assert isinstance(answer, bytes), answer
    return json.loads(answer)["batch"]


def test_a_body_that_does_not_fit_releases_the_ones_written_before_it(tmp_path, monkeypatch):
    store = SQLiteStore(tmp_path)
    original = SegmentLog.append
    calls = []

    def append(self: SegmentLog, body: bytes):
        calls.append(body)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, body)

    monkeypatch.setattr(SegmentLog, "append", append)
    live = dict(store.segments.live)
    change = WriteSet(
        inserts=[
            (GroupRow(id=i, env_id=None, size=1, order=i, buffered=False), b"{}") for i in (1, 2)
        ]
    )
    with pytest.raises(OSError) as failure:
        store.write(change)
    assert write_failure(failure.value) == (
        "the API's disk is full: [Errno 28] No space left on device"
    )
    assert {k: v for k, v in store.segments.live.items() if v} == live
    assert store.load(idempotency_ttl_s=60).rows == []


def test_sqlite_rolling_back_by_itself_keeps_the_real_error(tmp_path):
    """SQLITE_FULL inside a statement ends the transaction; ROLLBACK must not mask it."""
    store = SQLiteStore(tmp_path)
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count={pages + 2}")  # a real SQLITE_FULL
    with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
        store.write(WriteSet(kv={"big": "x" * 200_000}))
    store._db.execute("PRAGMA max_page_count=1000000")
    store.write(WriteSet(kv={"big": "x" * 200_000}))
    assert store.load(idempotency_ttl_s=60).kv == {"big": "x" * 200_000}


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (sqlite3.OperationalError("database or disk is full"), "disk_full"),
        (OSError(errno.ENOSPC, "No space left on device"), "disk_full"),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), "disk_full"),
        (sqlite3.OperationalError("attempt to write a readonly database"), "read_only"),
        (OSError(errno.EROFS, "Read-only file system"), "read_only"),
        (sqlite3.OperationalError("disk I/O error"), "io"),
        (OSError(errno.EACCES, "Permission denied"), "permission"),
        (sqlite3.OperationalError("no such table: groups"), "other"),
    ],
)
def test_store_errors_are_named_by_their_cause(error, kind):
    assert fault_kind(error) == kind
