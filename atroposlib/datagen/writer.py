"""The jsonl output: checked before anything else, written one whole line at a time.

Design: each record is serialised first and written as one complete line, then flushed,
so a reader or a crash sees only whole lines. The writer marks the write as a critical
section (`busy`) so a signal handler can wait for the line to finish instead of
interrupting it. The output directory is never created: a typo in the path should stop
the tool before it registers, not leave data in an unexpected place. An existing file is
only ever appended to (`--append-to-previous`), never truncated; a new file is created
exclusively, so a file appearing in between is not overwritten either.

A record equal to one already in the file (its score aside) is dropped and counted,
unless duplicates are asked for: the best sequences of a group are often the same
completion, and an SFT set that repeats it N times only weights it N times. "Already in
the file" includes the lines an appended-to file held before.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


class OutputError(ValueError):
    """The output path cannot be used; the message says what to do."""


def check_output(path: Path, append: bool) -> None:
    """Refuse a path in a missing directory, a directory, or an existing file without append."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(
            f"the directory of {path} does not exist: create it first (mkdir -p {parent})"
        )
    if path.is_dir():
        raise OutputError(f"{path} is a directory; give a file path such as {path}/data.jsonl")
    if path.exists() and not append:
        raise OutputError(
            f"{path} already exists: pass --append-to-previous to add to it, or choose "
            "another path (it is never overwritten)"
        )


def record_key(record: Any) -> bytes:
    """What makes two records the same: everything but the score (upstream's format
    carries it), compared as canonical JSON."""
    if isinstance(record, dict):
        record = {key: value for key, value in record.items() if key != "score"}
    canonical = json.dumps(record, sort_keys=True, ensure_ascii=False, allow_nan=True)
    return hashlib.blake2b(canonical.encode(), digest_size=16).digest()


class JsonlWriter:
    """Appends records to a jsonl file, one flushed line per record, each distinct record
    once unless `keep_duplicates`."""

    def __init__(self, path: Path, append: bool, keep_duplicates: bool = False) -> None:
        self.path = path
        self.count = 0
        self.duplicates = 0
        """Records not written because the file already held an equal one."""
        self.busy = False
        self._seen: set[bytes] | None = None if keep_duplicates else set()
        self._file = open(path, "ab" if append else "xb")
        if append and self._file.tell() > 0:
            if self._seen is not None:
                self._seen.update(_existing_keys(path))
            if not _ends_with_newline(path):
                self._file.write(b"\n")  # finish a line someone else left open
                self._file.flush()

    def write(self, record: dict[str, Any]) -> bool:
        """Write `record` as one line; False (and counted) when it is a duplicate."""
        if self._seen is not None:
            key = record_key(record)
            if key in self._seen:
                self.duplicates += 1
                return False
            self._seen.add(key)
        line = json.dumps(record, ensure_ascii=False, allow_nan=False).encode() + b"\n"
        self.busy = True
        try:
            self._file.write(line)
            self._file.flush()
        finally:
            self.busy = False
        self.count += 1
        return True

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as existing:
        existing.seek(-1, 2)
        return existing.read(1) == b"\n"


def _existing_keys(path: Path) -> set[bytes]:
    """The keys of the records an appended-to file already holds (unreadable lines aside)."""
    keys = set()
    with open(path, "rb") as existing:
        for line in existing:
            try:
                keys.add(record_key(json.loads(line)))
            except ValueError:  # a cut or foreign line: nothing to compare with
                continue
    return keys
