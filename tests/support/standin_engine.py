"""A stand-in engine kind, registered from outside the library as a new engine would be.

`StandInEngine` is the whole kind: the module its server runs as, and its weight
route; `register_engine(StandInEngine(records))` is the registry line. Its server
(this module, run with `python -m`: the standard library's, with the tests' JSON
handler) answers the health check and takes pushed weights on `POST /load_weights`,
and writes each start and each load to the JSON lines file `records`, so a test sees
what the trainer did with it.
"""

from __future__ import annotations

import argparse
import json
import os
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx

from atroposlib.inference.engines import EngineKind
from atroposlib.weight_sync.errors import WeightSyncError
from tests.support.json_http import JsonHandler

RECORDS_VARIABLE = "STANDIN_ENGINE_RECORDS"
KEY_VARIABLE = "STANDIN_ENGINE_SYNC_KEY"


class StandInRoute:
    """Full weights by path, keyed like the real routes; no adapters, no shared memory."""

    takes_adapters = False
    shares_memory = False

    def launch_extras(self, mode, sync_key, lora_rank):
        return [], {KEY_VARIABLE: sync_key}

    def served_name(self, name, adapter):
        return name

    def push(self, url, push):
        answer = httpx.post(
            f"{url}/load_weights",
            json={"path": str(push.path), "version": push.version},
            headers={"Authorization": f"Bearer {push.sync_key}"},
            timeout=push.timeout_s,
        )
        if not answer.is_success:
            raise WeightSyncError(f"the stand-in refused the weights: {answer.text}")
        return 0.0


class StandInEngine(EngineKind):
    name = "standin"
    module = "tests.support.standin_engine"
    health_path = "/ready"

    def __init__(self, records: Path) -> None:
        self.records = records

    def launch_env(self) -> dict[str, str]:
        return {RECORDS_VARIABLE: str(self.records)}

    def weight_route(self) -> StandInRoute:
        return StandInRoute()


def record(entry: dict) -> None:
    with open(os.environ[RECORDS_VARIABLE], "a") as out:
        out.write(json.dumps(entry) + "\n")


class Handler(JsonHandler):
    def do_GET(self) -> None:
        self._answer(200 if self.path == "/ready" else 404, {})

    def do_POST(self) -> None:
        body = self.read_json()
        key = os.environ.get(KEY_VARIABLE)
        if self.path != "/load_weights" or self.headers.get("Authorization") != f"Bearer {key}":
            self._answer(403, {"detail": "no"})
            return
        record({"event": "load", **body})
        self._answer(200, {"ok": True})


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--model", "--host", "--port", "--served-model-name"):
        parser.add_argument(flag, required=True)
    args, rest = parser.parse_known_args()
    record({"event": "start", "model": args.model, "served": args.served_model_name})
    ThreadingHTTPServer((args.host, int(args.port)), Handler).serve_forever()


if __name__ == "__main__":
    main()
