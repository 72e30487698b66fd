"""A real HTTP proxy on 127.0.0.1 that can lose one answer on the way back, and logs the rest."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import httpx


@dataclass
class Delivery:
    """One `/batch` answer that carried groups: for which step, with which groups."""

    step: int | None
    tags: tuple[int, ...]
    delivered: bool


class LossyProxy:
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
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> LossyProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

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

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in ("host", "content-length", "connection")
                }
                answer = httpx.request(
                    self.command, proxy.target + self.path, content=body, headers=headers
                )
                if answer.status_code == 200 and proxy._record(self.path, answer.content):
                    self.close_connection = True  # the answer is lost on the way back
                    return
                self.send_response(answer.status_code)
                self.send_header("Content-Type", answer.headers.get("content-type", "text/plain"))
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = _forward

            def log_message(self, *args: object) -> None:
                pass

        return Handler
