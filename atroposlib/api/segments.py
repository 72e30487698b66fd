"""Append-only segment files holding group bodies for the SQLite store.

Groups are large (~100 KB for 8 x 1024 tokens) and short-lived: most are served
seconds after they arrive. Kept as SQLite blobs, each body would be written to
the WAL and then copied again into the database file at every checkpoint. Here
a body is written once with `os.write`, SQLite records only (segment, offset,
length), and a segment file is unlinked as soon as its last group is served.
The store calls `sync()` before the commit that answers a post: the bodies, and a
new segment's name, are on the disk before the client hears 200 and deletes its own
copy, so a power loss loses nothing acknowledged (DUR-1 of the security review).

A new segment is started at every open, so a torn write at a crash can never
sit in front of newer data.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from atroposlib.utils.durable import fsync_dir

logger = logging.getLogger("atroposlib.api")

SEGMENT_BYTES = 64 * 2**20
_NAME = re.compile(r"^seg-(\d{8})\.log$")

Location = tuple[int, int, int]  # (segment, offset, length)


class SegmentLog:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.live: dict[int, int] = {}
        self._readers: dict[int, int] = {}
        existing = [int(m.group(1)) for p in self.dir.iterdir() if (m := _NAME.match(p.name))]
        self.active = max(existing, default=0) + 1
        self._fd = self._open_active()
        self._size = 0
        self._unsynced = False
        self._new_name = True  # the active segment's directory entry is not yet durable

    def _path(self, segment: int) -> Path:
        return self.dir / f"seg-{segment:08d}.log"

    def _open_active(self) -> int:
        return os.open(self._path(self.active), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def adopt(self, locations: list[Location]) -> set[int]:
        """Count live bodies after a restart; returns the indexes of unreadable ones."""
        sizes: dict[int, int] = {}
        broken = set()
        for index, (segment, offset, length) in enumerate(locations):
            if segment not in sizes:
                path = self._path(segment)
                sizes[segment] = path.stat().st_size if path.exists() else -1
            if offset + length > sizes[segment]:
                broken.add(index)
                continue
            self.live[segment] = self.live.get(segment, 0) + 1
        for path in self.dir.iterdir():
            match = _NAME.match(path.name)
            if (
                match
                and int(match.group(1)) not in self.live
                and int(match.group(1)) != self.active
            ):
                path.unlink()
        return broken

    def append(self, body: bytes) -> Location:
        if self._size + len(body) > SEGMENT_BYTES and self._size > 0:
            self._rotate()
        offset = self._size
        view = memoryview(body)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError:
            self._size = os.fstat(self._fd).st_size  # keep offsets true after a partial write
            raise
        self._size += len(body)
        self._unsynced = True
        self.live[self.active] = self.live.get(self.active, 0) + 1
        return (self.active, offset, len(body))

    def sync(self) -> None:
        """Make every body appended so far durable (one fdatasync for a batch of them)."""
        if self._unsynced:
            os.fdatasync(self._fd)
            self._unsynced = False
        if self._new_name:
            fsync_dir(self.dir)
            self._new_name = False

    def read(self, location: Location) -> bytes:
        segment, offset, length = location
        fd = self._readers.get(segment)
        if fd is None:
            fd = self._readers[segment] = os.open(self._path(segment), os.O_RDONLY)
        data = os.pread(fd, length, offset)
        if len(data) != length:
            raise OSError(f"segment {segment} is shorter than expected")
        return data

    def release(self, location: Location) -> None:
        """A body is no longer referenced; drop its segment when nothing else is."""
        segment = location[0]
        self.live[segment] -= 1
        if self.live[segment] == 0 and segment != self.active:
            self._drop(segment)

    def _rotate(self) -> None:
        previous = self.active
        self.active += 1
        try:  # open first: a failed open (disk full) must leave a usable active segment
            fd = self._open_active()
        except OSError:
            self.active = previous
            raise
        if self._unsynced:  # the bodies still to sync are in the segment being closed
            os.fdatasync(self._fd)
            self._unsynced = False
        self._new_name = True
        os.close(self._fd)
        self._fd = fd
        self._size = 0
        if self.live.get(previous, 0) == 0:
            self._drop(previous)

    def _drop(self, segment: int) -> None:
        self.live.pop(segment, None)
        fd = self._readers.pop(segment, None)
        if fd is not None:
            os.close(fd)
        self._path(segment).unlink(missing_ok=True)

    def clear(self) -> None:
        for segment in list(self.live):
            if segment != self.active:
                self._drop(segment)
        self.live.pop(self.active, None)
        self._rotate()

    def close(self) -> None:
        os.close(self._fd)
        for fd in self._readers.values():
            os.close(fd)
        self._readers.clear()
