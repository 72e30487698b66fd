"""Where accepted groups and run state live: a tiny seam with two implementations.

`SQLiteStore` (the default) makes the API durable: every accepted group, the
per-env buffers, the registration, the env table, the step counter and the
idempotency answers are committed before the client hears 200. A batch's groups
are either deleted in the same transaction that advances the step (a trainer
that does not say which step it wants), or leased to their step in that
transaction and deleted only when the trainer says a checkpoint covers it. SQLite runs
in WAL mode with synchronous=FULL: a commit is on the disk before it returns, so what
a client was told survives a power loss, not only `kill -9` (DUR-1 of the security
review: with NORMAL, an acknowledged group, whose sender then deletes its own copy,
could be lost, and a batch taken could come back to be trained twice). Group bodies
are appended to segment files (`segments.py`), synced before the commit that names
them, and SQLite holds where they are, which avoids writing every 100 KB body twice.

`MemoryStore` keeps the same data in dicts for `--ephemeral` runs and tests.

The store never decides anything: `RunState` plans a change in memory, hands the
store a `WriteSet`, and only applies the plan to its own structures once the
store has committed it. A write that fails (disk full, read-only, I/O error)
rolls back completely, so the caller can refuse the request and retry later;
`write_failure` turns such an error into words a person can act on.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import sqlite3
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atroposlib.api.segments import Location, SegmentLog
from atroposlib.protocol import group_id_of

logger = logging.getLogger("atroposlib.api")


@dataclass(frozen=True)
class GroupRow:
    """What the scheduler needs to know about a stored group (its body stays in the store)."""

    id: int
    env_id: int | None
    size: int
    order: int
    buffered: bool
    served_step: int | None = None  # leased to this step, kept until released


@dataclass
class WriteSet:
    """One atomic change: new groups, buffered groups moving to the queue, state keys."""

    inserts: list[tuple[GroupRow, bytes]] = field(default_factory=list)
    promotions: list[tuple[int, int]] = field(default_factory=list)  # (id, new order)
    kv: dict[str, Any] = field(default_factory=dict)
    idempotency: tuple[str, bytes] | None = None


@dataclass
class LoadedState:
    kv: dict[str, Any]
    rows: list[GroupRow]
    idempotency: dict[str, tuple[bytes, float]]
    latest: bytes | None


class GroupStore(ABC):
    """Persistence seam of the trajectory API."""

    kind: str
    dir: Path | None = None  # where it writes, for naming a failure's cause

    @abstractmethod
    def load(self, idempotency_ttl_s: float | None) -> LoadedState:
        """Everything needed to rebuild the in-memory state at start-up."""

    @abstractmethod
    def write(self, change: WriteSet) -> None:
        """Apply `change` atomically."""

    @abstractmethod
    def bodies(self, ids: list[int]) -> list[bytes]:
        """Stored JSON of the given groups, in the order of `ids`."""

    @abstractmethod
    def remove(self, ids: list[int], kv: dict[str, Any]) -> None:
        """Delete served groups and update state keys in one transaction."""

    @abstractmethod
    def lease(self, ids: list[int], step: int, kv: dict[str, Any]) -> None:
        """Mark groups as served for `step` (kept for a re-serve) and update state keys."""

    @abstractmethod
    def prune_idempotency(self, older_than: float) -> None:
        """Forget idempotency answers created before `older_than` (epoch seconds)."""

    @abstractmethod
    def reset(self) -> None:
        """Forget everything."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release files and locks."""


class MemoryStore(GroupStore):
    kind = "memory"

    def __init__(self) -> None:
        self._bodies: dict[int, bytes] = {}
        self._kv: dict[str, Any] = {}

    def load(self, idempotency_ttl_s: float | None) -> LoadedState:
        return LoadedState(kv=dict(self._kv), rows=[], idempotency={}, latest=None)

    def write(self, change: WriteSet) -> None:
        for row, body in change.inserts:
            self._bodies[row.id] = body
        self._kv.update(change.kv)

    def bodies(self, ids: list[int]) -> list[bytes]:
        return [self._bodies[i] for i in ids]

    def remove(self, ids: list[int], kv: dict[str, Any]) -> None:
        for i in ids:
            del self._bodies[i]
        self._kv.update(kv)

    def lease(self, ids: list[int], step: int, kv: dict[str, Any]) -> None:
        self._kv.update(kv)

    def prune_idempotency(self, older_than: float) -> None:
        pass

    def reset(self) -> None:
        self._bodies.clear()
        self._kv.clear()


_SCHEMA = """
CREATE TABLE IF NOT EXISTS groups (
    id INTEGER PRIMARY KEY,
    env_id INTEGER,
    size INTEGER NOT NULL,
    qorder INTEGER NOT NULL,
    buffered INTEGER NOT NULL,
    served_step INTEGER,
    segment INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    length INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS idempotency (
    key TEXT PRIMARY KEY,
    response BLOB NOT NULL,
    created REAL NOT NULL
);
"""


class StateDirLocked(RuntimeError):
    pass


class StateDirUnusable(RuntimeError):
    """The state directory cannot be written; the message names it and the cause."""


PROBE_BYTES = 256 * 1024
"""What `check_state_dir` writes (and deletes) to prove the directory has room."""

_ERRNO_KIND = {
    errno.ENOSPC: "disk_full",
    errno.EDQUOT: "disk_full",
    errno.EFBIG: "disk_full",
    errno.EROFS: "read_only",
    errno.EACCES: "permission",
    errno.EPERM: "permission",
    errno.ENOTDIR: "not_a_directory",
    errno.EIO: "io",
}
_SQLITE_KIND = {13: "disk_full", 8: "read_only", 3: "permission", 10: "io"}  # FULL, READONLY...
_SQLITE_EXTENDED_KIND = {4874: "disk_full"}  # SQLITE_IOERR_SHMSIZE: the -shm file cannot grow
FULL_BELOW_BYTES = 64 * 1024
"""An I/O error in a directory with less free space than this is reported as a full disk."""
_TEXT_KIND = (
    ("disk is full", "disk_full"),
    ("readonly", "read_only"),
    ("read-only", "read_only"),
    ("disk i/o error", "io"),
)
CAUSES = {
    "disk_full": "no space left on device",
    "read_only": "read-only file system",
    "permission": "permission denied",
    "not_a_directory": "a part of the path is not a directory",
    "io": "I/O error",
    "other": "cannot write",
}
_HEADLINES = {
    "disk_full": "the API's disk is full",
    "read_only": "the API's state directory is read-only",
    "permission": "the API may not write its state directory",
    "not_a_directory": "the API's state directory is gone",
    "io": "the API's disk failed to write",
    "other": "the API's durable store failed to write",
}


def fault_kind(exc: BaseException, directory: Path | None = None) -> str:
    """disk_full, read_only, permission, not_a_directory, io or other.

    SQLite reports some full-disk failures as plain I/O errors (growing its -shm
    file, say), so an I/O error where `directory` has no room left counts as full.
    """
    kind = _kind_of(exc)
    if kind in ("io", "other") and directory is not None and _nearly_full(directory):
        return "disk_full"
    return kind


def _kind_of(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno in _ERRNO_KIND:
        return _ERRNO_KIND[exc.errno]
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        if code in _SQLITE_EXTENDED_KIND:
            return _SQLITE_EXTENDED_KIND[code]
        if code is not None and code & 0xFF in _SQLITE_KIND:
            return _SQLITE_KIND[code & 0xFF]
    text = str(exc).lower()
    return next((kind for needle, kind in _TEXT_KIND if needle in text), "other")


def _nearly_full(directory: Path) -> bool:
    try:
        stats = os.statvfs(directory)
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < FULL_BELOW_BYTES


def write_failure(exc: BaseException, directory: Path | None = None) -> str:
    """One line for a client or /status: what broke, then the error itself."""
    return f"{_HEADLINES[fault_kind(exc, directory)]}: {exc}"


class SQLiteStore(GroupStore):
    kind = "sqlite"
    dir: Path  # always set: the state directory
    _db: sqlite3.Connection  # set by _open, which closes it itself when it fails

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.dir / "run-api.lock", "w")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            self._lock_file.close()
            raise StateDirLocked(
                f"another run-api process is using the state directory {self.dir}; "
                "stop it or pass a different --state-dir"
            ) from exc
        try:
            self._open()
        except BaseException:
            self._lock_file.close()
            raise

    def _open(self) -> None:
        self.path = self.dir / "trajectories.sqlite3"
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            self._db.execute("PRAGMA page_size=16384")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._db.executescript(_SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(groups)")}
            if "served_step" not in columns:  # a state dir written before leases existed
                self._db.execute("ALTER TABLE groups ADD COLUMN served_step INTEGER")
            self.segments = SegmentLog(self.dir / "segments")
            self._where: dict[int, Location] = {}
        except BaseException:
            self._db.close()
            raise

    def _transaction(self):
        return _Transaction(self._db)

    def load(self, idempotency_ttl_s: float | None) -> LoadedState:
        kv = {k: json.loads(v) for k, v in self._db.execute("SELECT key, value FROM kv")}
        found = self._db.execute(
            "SELECT id, env_id, size, qorder, buffered, served_step, segment, offset, length "
            "FROM groups ORDER BY qorder, id"
        ).fetchall()
        broken = self.segments.adopt([(seg, off, n) for *_, seg, off, n in found])
        if broken:
            lost = [found[i][0] for i in sorted(broken)]
            logger.error("%d stored groups have no readable body and are dropped", len(lost))
            try:  # left in the table, they are found broken (and dropped) again next start
                with self._transaction() as db:
                    db.executemany("DELETE FROM groups WHERE id = ?", [(i,) for i in lost])
            except (sqlite3.Error, OSError) as exc:
                logger.warning("cannot delete the broken groups yet: %s", write_failure(exc))
        rows = []
        for index, (i, e, s, o, b, served, seg, off, n) in enumerate(found):
            if index not in broken:
                rows.append(
                    GroupRow(id=i, env_id=e, size=s, order=o, buffered=bool(b), served_step=served)
                )
                self._where[i] = (seg, off, n)
        try:  # housekeeping: a full disk must not stop a restart
            if idempotency_ttl_s is not None:
                self.prune_idempotency(time.time() - idempotency_ttl_s)
        except (sqlite3.Error, OSError) as exc:
            logger.warning("cannot prune idempotency answers: %s", write_failure(exc))
        idem = {
            k: (bytes(r), c)
            for k, r, c in self._db.execute("SELECT key, response, created FROM idempotency")
        }
        queued = [row for row in rows if not row.buffered and row.served_step is None]
        latest = self.bodies([queued[-1].id])[0] if queued else None
        return LoadedState(kv=kv, rows=rows, idempotency=idem, latest=latest)

    def write(self, change: WriteSet) -> None:
        placed: list[tuple[GroupRow, Location]] = []
        try:
            for row, body in change.inserts:
                placed.append((row, self.segments.append(body)))
            self.segments.sync()  # the bodies before the rows that point at them
            self._commit(change, placed)
        except BaseException:
            for _, at in placed:
                self.segments.release(at)
            raise
        for row, at in placed:
            self._where[row.id] = at

    def _commit(self, change: WriteSet, placed: list[tuple[GroupRow, Location]]) -> None:
        with self._transaction() as db:
            if placed:
                db.executemany(
                    "INSERT INTO groups (id, env_id, size, qorder, buffered, segment, offset, "
                    "length) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [(r.id, r.env_id, r.size, r.order, int(r.buffered), *at) for r, at in placed],
                )
            if change.promotions:
                db.executemany(
                    "UPDATE groups SET buffered = 0, qorder = ? WHERE id = ?",
                    [(order, gid) for gid, order in change.promotions],
                )
            self._put_kv(db, change.kv)
            if change.idempotency is not None:
                key, response = change.idempotency
                db.execute(
                    "INSERT OR REPLACE INTO idempotency (key, response, created) VALUES (?, ?, ?)",
                    (key, response, time.time()),
                )

    def bodies(self, ids: list[int]) -> list[bytes]:
        return [self.segments.read(self._where[i]) for i in ids]

    def remove(self, ids: list[int], kv: dict[str, Any]) -> None:
        with self._transaction() as db:
            db.executemany("DELETE FROM groups WHERE id = ?", [(i,) for i in ids])
            self._put_kv(db, kv)
        for i in ids:
            self.segments.release(self._where.pop(i))

    def lease(self, ids: list[int], step: int, kv: dict[str, Any]) -> None:
        with self._transaction() as db:
            db.executemany(
                "UPDATE groups SET served_step = ? WHERE id = ?", [(step, i) for i in ids]
            )
            self._put_kv(db, kv)

    def prune_idempotency(self, older_than: float) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM idempotency WHERE created < ?", (older_than,))

    def reset(self) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM groups")
            db.execute("DELETE FROM kv")
            db.execute("DELETE FROM idempotency")
        self._where.clear()
        try:  # committed: leftover segment files are deleted at the next start
            self.segments.clear()
        except OSError as exc:
            logger.warning("segment files not cleared after a reset: %s", exc)

    def close(self) -> None:
        self._db.close()
        self.segments.close()
        self._lock_file.close()

    @staticmethod
    def _put_kv(db: sqlite3.Connection, kv: dict[str, Any]) -> None:
        if kv:
            db.executemany(
                "INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)",
                [(k, json.dumps(v)) for k, v in kv.items()],
            )


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self.db.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
        else:
            self._rollback()

    def _rollback(self) -> None:
        """Undo what is left: SQLite has already rolled back after some errors (SQLITE_FULL)."""
        if self.db.in_transaction:
            try:
                self.db.execute("ROLLBACK")
            except sqlite3.Error as exc:  # the original error is the one worth raising
                logger.error("rollback failed: %s", exc)


def open_store(state_dir: str | os.PathLike[str] | None, ephemeral: bool) -> GroupStore:
    return MemoryStore() if ephemeral or state_dir is None else SQLiteStore(state_dir)


def queued_group_ids(
    state_dir: str | os.PathLike[str], kept_through: int | None = None
) -> set[str]:
    """Ids of the groups a stopped API's store still holds for training: queued, or leased
    to a step after `kept_through` (the newest checkpoint's step; None: every lease was
    trained). The store's one query for other processes (the launcher's group account);
    it reads and changes nothing."""

    def waiting(served_step: int | None) -> bool:
        return served_step is None or (kept_through is not None and served_step > kept_through)

    store = SQLiteStore(state_dir)
    try:
        rows = [row for row in store.load(idempotency_ttl_s=None).rows if waiting(row.served_step)]
        bodies = store.bodies([row.id for row in rows])
    finally:
        store.close()
    return {i for i in (group_id_of(json.loads(body)) for body in bodies) if i is not None}


def check_state_dir(state_dir: str | os.PathLike[str]) -> None:
    """Open the store as the server will, then write, fsync and delete a probe file.

    Run before the server starts, so an unwritable or full directory is one clear
    line (`StateDirUnusable`, or `StateDirLocked`) instead of a failed start-up.
    """
    try:
        store = SQLiteStore(state_dir)
        try:
            _probe(store.dir)
        finally:
            store.close()
    except (OSError, sqlite3.Error) as exc:
        cause = CAUSES[fault_kind(exc, Path(state_dir))]
        raise StateDirUnusable(
            f"cannot use the state directory {state_dir}: {cause} ({exc})"
        ) from exc


def _probe(directory: Path) -> None:
    path = directory / f".write-probe-{os.getpid()}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(bytes(PROBE_BYTES))
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        path.unlink(missing_ok=True)
