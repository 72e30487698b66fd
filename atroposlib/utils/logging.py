"""Logging set-up shared by the services: rich console, plain text, or one JSON object per line.

`auto` picks rich colours on a terminal and plain text when piped to a file
(so logs stay greppable and free of escape codes).

A line a person reads fits an 80-column console beside the launcher's prefix
(`MESSAGE_WIDTH`); what only a debugging person needs goes at DEBUG on a logger that
`keep_debug_in_files` turns on where the log is a file or a pipe, not a terminal.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

CONSOLE_COLUMNS = 80
LAUNCHER_PREFIX = len("mod_arithmetic | ")
"""What atropos-launch puts before a child's line: its name, padded to the longest
(the quickstart's environment), and a bar."""
MESSAGE_WIDTH = CONSOLE_COLUMNS - LAUNCHER_PREFIX
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""A record's first line in the plain-text format; its traceback and any further lines
of its message follow without this prefix (the launcher's console reads it so:
`atroposlib.launch.console`)."""
TIME_FORMAT = "%H:%M:%S"


def shorten(text: str, width: int) -> str:
    """`text`, cut to `width` characters with "..." where it was cut."""
    return text if len(text) <= width else text[: max(width - 3, 0)] + "..."


def short_path(path: str | Path, width: int, cwd: Path | None = None) -> str:
    """`path` for a console line: relative to the working directory where it is under
    it, and cut to its last folders after ".../" where it is still wider than `width`
    (its whole name belongs in a DEBUG line beside)."""
    path, cwd = Path(path), Path.cwd() if cwd is None else cwd
    if path.is_absolute() and path.is_relative_to(cwd):
        path = path.relative_to(cwd)
    text = str(path)
    if len(text) <= width:
        return text
    parts = path.parts
    for start in range(1, len(parts)):
        tail = ".../" + "/".join(parts[start:])
        if len(tail) <= width:
            return tail
    return shorten(parts[-1], width)


def keep_debug_in_files(name: str, stream: Any = None) -> None:
    """Turn DEBUG on for logger `name` where the log (`stream`, stderr by default) is
    not a terminal: a file or a pipe (the launcher's log file) keeps its records, and a
    person at a terminal reads the INFO lines. The launcher's console shows no DEBUG."""
    stream = sys.stderr if stream is None else stream
    if not stream.isatty():
        logging.getLogger(name).setLevel(logging.DEBUG)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    if fmt == "auto":
        fmt = "rich" if sys.stderr.isatty() else "text"
    handler: logging.Handler = logging.StreamHandler()
    if fmt == "rich":
        from rich.logging import RichHandler

        handler = RichHandler(show_path=False, log_time_format="%H:%M:%S")
    elif fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT, TIME_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # one INFO line per HTTP request drowns the lines people read
    for chatty in ("httpx", "httpx2"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, root.level))
