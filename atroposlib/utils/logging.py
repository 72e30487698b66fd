"""Logging set-up shared by the services: rich console, plain text, or one JSON object per line.

`auto` picks rich colours on a terminal and plain text when piped to a file
(so logs stay greppable and free of escape codes).
"""

from __future__ import annotations

import json
import logging
import sys
import time


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
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # one INFO line per HTTP request drowns the lines people read
    for chatty in ("httpx", "httpx2"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, root.level))
