"""What the launcher's console shows of a child's output line; its log file keeps it whole.

A log record in the services' text format (`atroposlib.utils.logging`) starts with
its time, level and logger. Beside the child's name that is 30-odd columns of
prefix on every line, so the console shows an INFO record as its message alone, and
any other level with its level and logger; the time stays in the log file. DEBUG
records (an environment's whole metrics dict, each step) go to the file only. Any
other line (a traceback, a tool's own output) is shown as it is.

The launcher's own lines fit 80 columns too; a path in one is shown relative to the
working directory where it is under it (`key_line`).
"""

from __future__ import annotations

import re
from pathlib import Path

from atroposlib.utils.exposure import API_KEY_ENVIRONMENT

RECORD = re.compile(r"^\d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+): (.*)$", re.S)


def console_text(line: str) -> str | None:
    """`line` as the console shows it, or None for a line that only the log file keeps."""
    found = RECORD.match(line)
    if found is None:
        return line
    level, logger, message = found.groups()
    if level == "DEBUG":
        return None
    if level == "INFO":
        return message
    return f"{level} {logger}: {message}"


def key_line(path: Path, cwd: Path | None = None) -> str:
    """Where the run's key is, for clients that read it from `API_KEY_ENVIRONMENT`. The
    launcher prints the run directory whole; this line names it from the working
    directory, as `runs/<run>/api-key`, so that it fits the console."""
    cwd = Path.cwd() if cwd is None else cwd
    shown = path.relative_to(cwd) if path.is_relative_to(cwd) else path
    return f"{API_KEY_ENVIRONMENT} is in {shown}"
