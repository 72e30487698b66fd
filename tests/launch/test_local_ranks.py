"""Several trainer ranks on one machine with the rendezvous store on loopback (NET-1).

Real ranks: each is a Python process that joins a gloo group through `env://`, as a
trainer written for torchrun does, and sums its rank with the others'.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from atroposlib.utils.processes import descendants
from tests.support.waiting import wait_until

pytest.importorskip("torch")
pytestmark = pytest.mark.integration

RANK = """
import os, sys, time
from pathlib import Path
import torch, torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
folder = Path(sys.argv[1])
(folder / f"rank-{dist.get_rank()}").write_text(f"{total.item():g} {os.getpid()}")
if sys.argv[2] == "wait":  # until the test has looked at the sockets, or a signal
    while not (folder / "go").exists():
        time.sleep(0.05)
if sys.argv[2] == "fail" and dist.get_rank() == 1:
    while not (folder / "rank-0").exists():  # the test reads rank 0's pid from it
        time.sleep(0.05)
    # os._exit: at a normal exit with the group still up, gloo's threads may abort the
    # interpreter ("terminate called without an active exception", code 134) first.
    os._exit(3)
if sys.argv[2] == "fail":
    time.sleep(600)
dist.destroy_process_group()
"""


def spawner(tmp_path: Path, mode: str, nproc: int = 2) -> subprocess.Popen:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    command = [sys.executable, "-m", "atroposlib.launch.local_ranks", "--nproc", str(nproc)]
    return subprocess.Popen(
        [*command, "--", sys.executable, str(script), str(tmp_path), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def listening_addresses(pids: set[int]) -> set[str]:
    """Local addresses of the TCP sockets the processes `pids` listen on."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.add(fields[1].rsplit(":", 1)[0])
    return found


LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1 and ::1, as /proc has them


def test_ranks_meet_on_a_store_that_listens_on_loopback_only(tmp_path):
    """torchrun's store listened on every interface (`*:PORT`), with no key."""
    proc = spawner(tmp_path, "wait")
    try:
        wait_until(
            lambda: all((tmp_path / f"rank-{r}").exists() for r in range(2)), 120, "ranks met"
        )
        sums = {(tmp_path / f"rank-{r}").read_text().split()[0] for r in range(2)}
        assert sums == {"1"}  # 0 + 1, summed across the group
        tree = {proc.pid, *descendants(proc.pid)}
        listening = listening_addresses(tree)
        assert listening and listening <= LOOPBACK, listening
        (tmp_path / "go").touch()
        assert proc.wait(60) == 0, proc.stdout.read().decode()
    finally:
        proc.kill()


def test_a_failed_rank_stops_the_others_and_its_code_is_the_groups(tmp_path):
    proc = spawner(tmp_path, "fail")
    try:
        assert proc.wait(120) == 3, proc.stdout.read().decode()
        pid = int((tmp_path / "rank-0").read_text().split()[1])
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), 30, "rank 0 outlived the group")
    finally:
        proc.kill()


def test_a_signal_reaches_every_rank_once(tmp_path):
    proc = spawner(tmp_path, "wait")
    try:
        wait_until(
            lambda: all((tmp_path / f"rank-{r}").exists() for r in range(2)), 120, "ranks met"
        )
        pids = [int((tmp_path / f"rank-{r}").read_text().split()[1]) for r in range(2)]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 128 + signal.SIGTERM, proc.stdout.read().decode()
        assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    finally:
        proc.kill()


def test_the_launcher_runs_several_ranks_through_it(tmp_path):
    from atroposlib.launch.config import load_config
    from atroposlib.launch.plan import plan
    from tests.support.launch import launch_config, write_config

    config = launch_config(tmp_path / "run")
    config["trainer"]["nproc"] = 2
    path = write_config(tmp_path / "c.yaml", config)
    command = plan(load_config(path), path).trainer.command
    assert command[1:6] == ["-m", "atroposlib.launch.local_ranks", "--nproc", "2", "--"]
    assert "torch.distributed.run" not in command
