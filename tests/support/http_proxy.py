"""A real HTTP proxy on 127.0.0.1 that can lose one answer on the way back, and logs the rest."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import httpx

from tests.support.json_http import LocalHttpServer, QuietHandler


@dataclass
class Delivery:
    """One `/batch` answer that carried groups: for which step, with which groups."""

    step: int | None
    tags: tuple[int, ...]
    delivered: bool


class LossyProxy(LocalHttpServer):
    """Forwards every request to `target`; drops the first batch answer for `drop_step`.

    Dropping means closing the connection without a response after the API has
    answered, which is what a timeout or a network cut looks like to the trainer.
    Groups are identified by the first token of their first sequence (their tag).
    """

    def __init__(self, target: str, drop_step: int | None = None) -> None:
        self.target = target.rstrip("/")
        self.drop_step = drop_step
        self.deliveries: list[Delivery] = []
        self.lock = threading.Lock()
        super().__init__(_ForwardingHandler)

    def _record(self, path: str, body: bytes) -> bool:
        """Log a batch answer; True when this answer must be lost."""
        split = urlsplit(path)
        if split.path != "/batch":
            return False
        batch = json.loads(body).get("batch")
        if not batch:
            return False
        step_values = parse_qs(split.query).get("step")
        step = int(step_values[0]) if step_values else None
        tags = tuple(group["tokens"][0][0] for group in batch)
        with self.lock:
            drop = step == self.drop_step and not any(d.step == step for d in self.deliveries)
            self.deliveries.append(Delivery(step, tags, delivered=not drop))
        return drop


class _ForwardingHandler(QuietHandler):
    def _forward(self) -> None:
        proxy: LossyProxy = self.owner
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {
            k: v
            for k, v in self.headers.items()
            if k.lower() not in ("host", "content-length", "connection")
        }
        url = proxy.target + self.path
        answer = httpx.request(self.command, url, content=body, headers=headers)
        if answer.status_code == 200 and proxy._record(self.path, answer.content):
            self.close_connection = True  # the answer is lost on the way back
            return
        self.send_response(answer.status_code)
        self.send_header("Content-Type", answer.headers.get("content-type", "text/plain"))
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    do_GET = do_POST = _forward
