"""What the launcher's console shows of a child's output line; its log file keeps it whole.

A log record in the services' text format (`atroposlib.utils.logging.TEXT_FORMAT`)
starts with its time, level and logger. Beside the child's name that is 30-odd columns
of prefix on every line, so the console shows an INFO record as its message alone, and
any other level with its level and logger; the time stays in the log file. DEBUG
records (an environment's whole metrics dict, each step) go to the file only. The
lines after a record's first that lack that prefix (its traceback, the rest of a
message of several lines) go with it: shown after a shown record, as they are, and
never after a DEBUG one (`ChildConsole`). A line before any record (a tool's own
output) is shown as it is.

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


class ChildConsole:
    """What the console shows of one child's output, line after line: a line that does
    not start a record continues the last one and is shown where that record was."""

    def __init__(self) -> None:
        self.showing = True

    def shown(self, line: str) -> str | None:
        """`line` as the console shows it, or None for a line that only the log file keeps."""
        if RECORD.match(line) is None:
            return line if self.showing else None
        text = console_text(line)
        self.showing = text is not None
        return text


def key_line(path: Path, cwd: Path | None = None) -> str:
    """Where the run's key is, for clients that read it from `API_KEY_ENVIRONMENT`. The
    launcher prints the run directory whole; this line names it from the working
    directory, as `runs/<run>/api-key`, so that it fits the console."""
    return f"{API_KEY_ENVIRONMENT} is in {shown_path(path, cwd)}"


def shown_path(path: Path, cwd: Path | None = None) -> Path:
    """`path` from the working directory when it is under it (shorter on the console)."""
    cwd = Path.cwd() if cwd is None else cwd
    return path.relative_to(cwd) if path.is_relative_to(cwd) else path
