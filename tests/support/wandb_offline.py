"""Read what an offline wandb run recorded, from its `.wandb` file.

Recent wandb writes neither `wandb-summary.json` nor an in-process summary in
offline mode, and ships no Python reader of its transaction log; the log is
LevelDB's record format (32 KiB blocks; each record a 7-byte header: crc32,
little-endian length, type FULL/FIRST/MIDDLE/LAST) after a 7-byte `:W&B`
header, each record a `wandb.proto` Record.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(data: bytes):
    offset, pending = HEADER, b""
    while offset + HEADER <= len(data):
        room = BLOCK - offset % BLOCK
        if room < HEADER:
            offset += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[offset : offset + HEADER])
        chunk = data[offset + HEADER : offset + HEADER + length]
        offset += HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""
        elif kind == 0 and length == 0:  # zero padding at the end of a block
            offset += BLOCK - offset % BLOCK if offset % BLOCK else 0


def offline_run(run_dir: Path) -> dict[str, Any]:
    """{"project", "group", "name", "finished", "history": [{key: value, "_step": n}, ...]}.

    wandb's service writes the file after `finish()` returns: "finished" (the exit
    record is there) says whether it is complete; see `offline_runs`.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    (log,) = Path(run_dir).glob("*.wandb")
    found: dict[str, Any] = {"history": [], "finished": False}
    for payload in _payloads(log.read_bytes()):
        record = pb.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            found.update(
                project=record.run.project,
                group=record.run.run_group,
                name=record.run.display_name,
            )
        elif kind == "exit":
            found["finished"] = True
        elif kind == "history":
            found["history"].append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return found


@dataclass
class OfflineRun:
    project: str
    group: str
    name: str
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def keys(self) -> set[str]:
        """Every key logged at some step (wandb's own `_step`, `_runtime`... left out)."""
        return {key for row in self.history for key in row if not key.startswith("_")}


def offline_runs(root: Path, expected: int = 1, timeout_s: float = 60) -> list[OfflineRun]:
    """Every offline run under `root` (at any depth), oldest first, once each is complete.

    wandb's service creates the run's files after `finish()` returns too, so this first
    waits (up to `timeout_s`) for at least `expected` runs to appear.
    """
    from tests.support.waiting import wait_until

    def started() -> list[Path]:
        return [
            run_dir
            for run_dir in sorted(Path(root).rglob("offline-run-*"))
            if run_dir.is_dir() and any(run_dir.glob("*.wandb"))
        ]

    wait_until(lambda: len(started()) >= expected, timeout_s, f"no {expected} wandb runs in {root}")
    found = []
    for run_dir in started():
        run = wait_until(
            lambda d=run_dir: (r := offline_run(d))["finished"] and r,
            timeout_s,
            f"wandb never finished writing {run_dir}",
        )
        found.append(
            OfflineRun(
                project=run.get("project", ""),
                group=run.get("group", ""),
                name=run.get("name", ""),
                history=run["history"],
            )
        )
    return found
