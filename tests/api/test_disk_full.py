"""A real disk that fills: run-api on a tiny tmpfs, and the start-up checks of --state-dir.

Mounting needs root (CI runs as root); elsewhere these tests skip and say why.
`test_store_faults.py` checks the exact answers with faults injected in-process.
"""

from __future__ import annotations

import errno
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from atroposlib.api.store import SQLiteStore
from atroposlib.cli.run_api import state_dir_problem
from atroposlib.utils.ports import free_port
from tests.support.groups import make_group, register, tags_of
from tests.support.processes import ApiProcess

pytestmark = pytest.mark.integration

DISK_FULL = "the API's disk is full"


@contextmanager
def tmpfs(where: Path, size: str, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` for the test, unmounted afterwards."""
    where.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except FileNotFoundError:
        pytest.skip("no `mount` command: a real small filesystem cannot be made here")
    if mounted.returncode != 0:
        pytest.skip(
            "mounting a tmpfs is not permitted here (needs root with CAP_SYS_ADMIN): "
            + mounted.stderr.strip()
        )
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=True)


def fill(path: Path, leave: int = 0) -> None:
    """Write zeros to `path` until its filesystem has at most `leave` bytes free."""
    chunk = bytes(64 * 1024)
    with open(path, "wb", buffering=0) as out:
        while (free := shutil.disk_usage(path.parent).free) > leave:
            try:
                out.write(chunk[: max(4096, min(len(chunk), free - leave))])
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    return
                raise


def post(client: httpx.Client, tag: int) -> httpx.Response:
    return client.post("/scored_data", json=make_group(4, tag=tag, length=256))


def assert_disk_full(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    detail = response.json()["detail"]
    assert detail.startswith(DISK_FULL) and detail.endswith("; retry later"), detail
    assert response.headers["retry-after"] == "2"


def test_a_disk_that_fills_refuses_posts_loses_nothing_and_recovers(tmp_path):
    with tmpfs(tmp_path / "disk", "2m") as disk:
        api = ApiProcess(disk / "state")
        api.log_path = tmp_path / "run-api.log"  # not on the disk being filled
        try:
            check_filling_disk(api, disk / "filler")
        finally:
            api.stop()


def check_filling_disk(api: ApiProcess, filler: Path) -> None:
    api.start()
    acknowledged: list[int] = []
    refused: list[int] = []
    with httpx.Client(base_url=api.url, timeout=10) as client:
        register(client, batch_size=4, max_token_len=512)  # one group per batch
        for tag in range(1, 6):
            assert post(client, tag).status_code == 200
            acknowledged.append(tag)
        fill(filler, leave=256 * 1024)
        for tag in range(6, 2000):
            response = post(client, tag)
            if response.status_code != 200:
                assert_disk_full(response)
                refused.append(tag)
                break
            acknowledged.append(tag)
        assert refused, "the disk never filled up"
        assert len(acknowledged) > 5, "no post went through after the filler was written"

        assert client.get("/health").json()["status"] == "ok"
        assert client.get("/status").json()["store_error"].startswith(DISK_FULL)
        assert "atropos_store_write_errors_total 1.0" in client.get("/metrics").text
        first = client.get("/batch")  # its step advance may not fit either
        if first.status_code == 503:
            assert_disk_full(first)

        filler.unlink()
        if first.status_code == 503:
            first = client.get("/batch")
        served = tags_of(first.json()["batch"])
        assert served == acknowledged[:1], "the first batch is the oldest group"
        for tag in (*refused, 5000, 5001):  # accepted again at once, no restart
            assert post(client, tag).status_code == 200
            acknowledged.append(tag)
        assert client.get("/status").json()["store_error"] is None
        for _ in range(len(acknowledged) // 2):
            served += tags_of(client.get("/batch").json()["batch"])

    api.stop()
    with sqlite3.connect(api.state_dir / "trajectories.sqlite3") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    api.start()
    with httpx.Client(base_url=api.url, timeout=10) as client:
        while (batch := client.get("/batch").json()["batch"]) is not None:
            served += tags_of(batch)
            assert len(served) <= len(acknowledged), "more groups served than acknowledged"
    assert served == acknowledged, "every acknowledged group, once, in order"


def run_api(state_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "atroposlib.cli.run_api"]
        + ["--port", str(free_port()), "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_refused_to_start(state_dir: Path, cause: str) -> None:
    result = run_api(state_dir)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"run-api: cannot use the state directory {state_dir}: {cause}")


def test_a_state_dir_below_a_file_is_refused_at_start(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    assert_refused_to_start(tmp_path / "file" / "state", "a part of the path is not a directory")


def test_a_read_only_state_dir_is_refused_at_start(tmp_path):
    with tmpfs(tmp_path / "ro", "1m", read_only=True) as disk:
        assert_refused_to_start(disk / "state", "read-only file system")
        assert_refused_to_start(disk, "read-only file system")


@pytest.mark.parametrize("existing", [False, True], ids=["new", "existing"])
def test_a_full_state_dir_is_refused_at_start(tmp_path, existing):
    with tmpfs(tmp_path / "full", "1m") as disk:
        if existing:  # a restart on a disk that filled while the server was down
            SQLiteStore(disk / "state").close()
        fill(disk / "filler")
        assert_refused_to_start(disk / "state", "no space left on device")
        (disk / "filler").unlink()
        assert state_dir_problem(str(disk / "state")) is None, "with room again it may start"
