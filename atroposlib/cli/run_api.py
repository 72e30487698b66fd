"""`run-api`: start the trajectory API (same flags as Atropos, plus ours)."""

from __future__ import annotations

import argparse
import os
import sys

import uvicorn

from atroposlib.api import SETTINGS_ENV
from atroposlib.api.settings import APISettings
from atroposlib.api.store import StateDirLocked, StateDirUnusable, check_state_dir
from atroposlib.utils.flags import add_model_flags, parse_settings
from atroposlib.utils.listen import ListenError, listen_problem, listen_socket, serve
from atroposlib.utils.logging import configure_logging


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run-api",
        description="Trajectory API: environments post scored groups, trainers pull batches.",
    )
    add_model_flags(parser, APISettings)
    return parser


def state_dir_problem(state_dir: str) -> str | None:
    """Why the durable store cannot work in `state_dir` (unwritable, full, in use), or None.

    Checked before uvicorn starts, with the store's own opening code, so the answer
    is one line and exit code 2 rather than a traceback from the server's start-up.
    """
    try:
        check_state_dir(state_dir)
    except (StateDirUnusable, StateDirLocked) as exc:
        return str(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    settings, _ = parse_settings(build_parser(), APISettings, argv)
    settings = settings.resolved()
    problem = settings.exposure_problem()
    if warning := settings.exposure_warning():
        print(f"run-api: {warning}", file=sys.stderr)
    sock = None
    if problem is None and settings.reload:  # uvicorn's reloader binds the port itself
        problem = listen_problem(settings.host, settings.port)
    elif problem is None:
        try:  # before the state dir, so a busy port leaves nothing behind
            sock = listen_socket(settings.host, settings.port)
        except ListenError as error:
            problem = str(error)
    if problem is None and not settings.ephemeral:
        problem = state_dir_problem(settings.state_dir)
    if problem:
        if sock is not None:
            sock.close()
        print(f"run-api: {problem}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    common = dict(
        host=settings.host,
        port=settings.port,
        access_log=settings.access_log,
        log_config=None,
        timeout_graceful_shutdown=5,
    )
    if sock is None:
        os.environ[SETTINGS_ENV] = settings.model_dump_json()
        uvicorn.run("atroposlib.api:app", reload=True, **common)
        return 0
    from atroposlib.api.server import create_app

    return serve(create_app(settings), sock, "run-api", **common)


if __name__ == "__main__":
    sys.exit(main())
