"""Run N ranks of a trainer on this machine with torch's rendezvous store on loopback.

    python -m atroposlib.launch.local_ranks --nproc 2 -- python -m my_trainer --my-flags

Why not `torchrun --standalone`: its rendezvous store (torch's `TCPStore`) listens on
every interface, whatever address it is given, and has no key (NET-1 in
docs/review-e6a9d2c.md): anyone who reaches the port can disturb or stop the ranks.
torchrun offers no way to change that. torch's `TCPStore` itself does: it serves on a
socket that is already listening (`master_listen_fd`). So this module binds that
socket to 127.0.0.1, serves the store on it, and starts each rank with torchrun's
environment (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, and
`TORCHELASTIC_USE_AGENT_STORE=True`). A trainer written for torchrun joins unchanged:
`init_process_group("env://")` then connects to this store as a client and opens no
port of its own.

What it keeps of torchrun's single-node behaviour, and no more: a rank that fails
stops the others and its exit code is the group's; SIGINT and SIGTERM reach every rank
once; a rank never outlives this process. It does not restart ranks (elastic
training); atropos-launch restarts the whole trainer, with `--resume`.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from typing import NoReturn

from atroposlib.utils.processes import die_with_parent, stop_group

POLL_S = 0.1
STOP_GRACE_S = 30.0


def rank_environment(rank: int, world_size: int, port: int) -> dict[str, str]:
    """What torchrun gives rank `rank` of a single-node group, agent store included."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
    }


def loopback_store():
    """A TCPStore served on a socket bound to 127.0.0.1 only: (store, port)."""
    from torch.distributed import TCPStore

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    store = TCPStore(
        "127.0.0.1",
        port,
        is_master=True,
        wait_for_workers=False,
        master_listen_fd=listener.detach(),  # the store owns the socket now
    )
    return store, port


def exit_code(returncode: int) -> int:
    """A rank's exit status as a shell reports it (a signal as 128 + its number)."""
    return 128 - returncode if returncode < 0 else returncode


def run(nproc: int, command: list[str], port: int) -> int:
    """Run the ranks against the store on `port` until they end: the group's exit code."""
    ranks: list[subprocess.Popen] = []

    def forward(signum: int, frame: object) -> None:
        for rank in ranks:
            if rank.poll() is None:
                os.killpg(rank.pid, signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    for rank in range(nproc):
        ranks.append(
            subprocess.Popen(
                command,
                env={**os.environ, **rank_environment(rank, nproc, port)},
                start_new_session=True,  # one signal per rank: this process forwards it
                preexec_fn=die_with_parent,
            )
        )
    try:
        while True:
            codes = [rank.poll() for rank in ranks]
            failed = [code for code in codes if code not in (None, 0)]
            if failed:  # the others are stopped on the way out
                return exit_code(failed[0])
            if all(code == 0 for code in codes):
                return 0
            time.sleep(POLL_S)
    finally:
        for process in ranks:
            stop_group(process, STOP_GRACE_S)


def main(argv: list[str] | None = None) -> NoReturn:
    parser = argparse.ArgumentParser(
        prog="python -m atroposlib.launch.local_ranks",
        description="Run --nproc ranks of COMMAND here, like torchrun --standalone, with "
        "the rendezvous store on 127.0.0.1 only.",
    )
    parser.add_argument("--nproc", type=int, required=True, help="Ranks to run (at least 1).")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the rank command.")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.nproc < 1 or not command:
        parser.error("give --nproc N (at least 1) and, after --, the command each rank runs")
    store, port = loopback_store()  # alive until the exit below, which skips its teardown
    code = run(args.nproc, command, port)
    exit_without_teardown(code)


def exit_without_teardown(code: int) -> NoReturn:
    """Exit now, leaving the store's server thread to the kernel.

    Destroying a `TCPStore` whose server thread is still handling a rank's disconnect
    aborts the process ("terminate called without an active exception", exit 134),
    which would hide the group's exit code. Every rank has been stopped by now, so
    nothing needs the store, and closing its socket is the kernel's job.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
