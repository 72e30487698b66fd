"""A stand-in for vLLM 0.32's dev-mode RL routes, run as a real server in a subprocess.

It answers the routes `SharedVLLMBridge` calls with the request and response
shapes of vllm/entrypoints/rl/online/api_router.py, /server_info's JSON form and
/collective_rpc, and keeps the worker's update-session rules (start while active,
update or finish without start are errors; a failed update ends the session,
v1/worker/gpu_worker.py:1524-1604). Every call is recorded. Tests steer it
through /_control: refuse a route with a status, hang a route until the server is
stopped (a timeout), or exit the process on a route (the engine dies mid-push), and
re-set it for the next test (`/_control/configure`: new settings, a fresh state), so a
module starts one process instead of one per test.

    python -m tests.support.fake_vllm_rl --port P --settings settings.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from fastapi import Body, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from atroposlib.utils.ports import free_port
from tests.support.processes import answers_health
from tests.support.source import REPO
from tests.support.waiting import wait_until

UPDATE_FIELDS = {"names", "dtype_names", "shapes", "ipc_handles_pickled"}


def create_app(settings: dict[str, Any]) -> FastAPI:
    """settings: model_dir, dtype, gpu_uuids, backend (None: no transfer config), insecure, tp."""
    app = FastAPI()
    state: dict[str, Any] = {}

    def fresh_state() -> None:
        state.clear()
        state.update(
            calls=[], faults={}, paused=False, active=False, version="0", initialized=False
        )

    fresh_state()

    @app.middleware("http")
    async def record_and_inject(request: Request, call_next):
        path = request.url.path
        if path.startswith("/_control"):
            return await call_next(request)
        body = await request.body()
        state["calls"].append(
            {
                "path": path,
                "query": dict(request.query_params),
                "body": json.loads(body) if body else None,
            }
        )
        fault = state["faults"].get(path)
        if fault is not None:
            if fault.get("die"):
                os._exit(1)
            if fault.get("hang"):
                await asyncio.Event().wait()  # until the process is stopped
            if fault.get("once"):
                state["faults"].pop(path)
            if fault.get("status"):
                if path == "/update_weights":
                    state["active"] = False  # as the worker does when an update raises
                return JSONResponse({"error": fault.get("error", "refused")}, fault["status"])
        return await call_next(request)

    def error(message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "code": 500}}, 500)

    @app.post("/_control/fault")
    async def set_fault(path: str = Body(...), fault: dict = Body(...)):
        state["faults"][path] = fault
        return {"ok": True}

    @app.post("/_control/configure")
    async def configure(new: dict = Body(...)):
        settings.clear()
        settings.update(new)
        fresh_state()
        return {"ok": True}

    @app.post("/_control/reset")
    async def reset_calls():
        state["calls"].clear()
        return {"ok": True}

    @app.get("/_control/state")
    async def get_state():
        return {k: state[k] for k in ("calls", "paused", "active", "version", "initialized")}

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/server_info")
    async def server_info(config_format: str = "text"):
        transfer = None if settings.get("backend") is None else {"backend": settings["backend"]}
        config = {
            "model_config": {
                "model": settings["model_dir"],
                "dtype": f"torch.{settings.get('dtype', 'float32')}",
                "revision": None,
            },
            "parallel_config": {
                "tensor_parallel_size": settings.get("tp", 1),
                "pipeline_parallel_size": 1,
                "data_parallel_size": 1,
            },
            "weight_transfer_config": transfer,
        }
        env = {
            "VLLM_SERVER_DEV_MODE": True,
            "VLLM_ALLOW_INSECURE_SERIALIZATION": settings.get("insecure", True),
        }
        return {
            "vllm_config": config if config_format == "json" else str(config),
            "vllm_env": env,
            "system_env": {},
        }

    @app.post("/collective_rpc")
    async def collective_rpc(request: Request):
        method = (await request.json()).get("method")
        if method != "atropos_device_uuid" or not settings.get("gpu_uuids"):
            return error(
                f"Call to collective_rpc method failed: Method {method!r} is not implemented."
            )
        return {"results": settings["gpu_uuids"]}

    @app.post("/init_weight_transfer_engine")
    async def init(init_info: dict = Body(..., embed=True)):
        state["initialized"] = True
        return {"message": "Weight transfer initialized"}

    @app.post("/pause")
    async def pause(mode: str = "abort", clear_cache: bool = True):
        if mode not in ("abort", "wait", "keep"):
            return JSONResponse({"error": f"Invalid pause mode: {mode}"}, 400)
        state["paused"] = True
        return {"status": "paused"}

    @app.post("/resume")
    async def resume():
        state["paused"] = False
        return {"status": "resumed"}

    @app.get("/is_paused")
    async def is_paused():
        return {"is_paused": state["paused"]}

    @app.post("/start_weight_update")
    async def start():
        if state["active"]:
            return error("start_weight_update called while a weight update is already active.")
        state["active"] = True
        return {"message": "Weight update started"}

    @app.post("/update_weights")
    async def update(update_info: dict = Body(..., embed=True)):
        if not state["active"]:
            return error("start_weight_update must be called before update_weights.")
        if set(update_info) != UPDATE_FIELDS:
            state["active"] = False
            return error(f"Invalid update_info: {sorted(update_info)}")
        return {"message": "Weights updated"}

    @app.post("/finish_weight_update")
    async def finish(weight_version: str | None = Body(None, embed=True)):
        if not state["active"]:
            return error("finish_weight_update called without a matching start_weight_update.")
        state["active"] = False
        return {"message": "Weight update finished"}

    @app.post("/update_weight_version")
    async def update_weight_version(new_version: str = Body(..., embed=True)):
        state["version"] = new_version
        return {"success": True, "new_version": new_version}

    @app.get("/weight_info")
    async def weight_info():
        return {"weight_version": state["version"]}

    @app.post("/shutdown_weight_transfer_engine")
    async def shutdown():
        state["initialized"] = False
        return {"message": "Weight transfer shut down"}

    return app


class FakeVLLM:
    """The stand-in as a subprocess on a free 127.0.0.1 port; `kill()` is an engine crash."""

    def __init__(self, workdir: Path, **settings: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.settings_path = workdir / f"fake-vllm-{self.port}.json"
        self.settings_path.write_text(json.dumps(settings))
        self.log_path = workdir / f"fake-vllm-{self.port}.log"
        self.proc: subprocess.Popen | None = None
        self.broken = False  # a route hung or the process killed: start another one

    def start(self, timeout_s: float = 30.0) -> FakeVLLM:
        command = [sys.executable, "-m", "tests.support.fake_vllm_rl"]
        command += ["--port", str(self.port), "--settings", str(self.settings_path)]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        wait_until(
            lambda: answers_health(self.url, self.proc, self.log, "fake vLLM"),
            timeout_s,
            "the fake vLLM did not become healthy",
        )
        httpx.post(f"{self.url}/_control/reset").raise_for_status()  # forget the health polls
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def configure(self, **settings: Any) -> FakeVLLM:
        """The same process as a new stand-in: these settings, no calls, no faults."""
        httpx.post(f"{self.url}/_control/configure", json=settings).raise_for_status()
        return self

    def reusable(self) -> bool:
        return not self.broken and not self.exited()

    def fault(self, path: str, **fault: Any) -> None:
        """status=N (refuse; once=True for one call), hang=True (never answer), die=True."""
        self.broken = self.broken or bool(fault.get("hang") or fault.get("die"))
        httpx.post(
            f"{self.url}/_control/fault", json={"path": path, "fault": fault}
        ).raise_for_status()

    def state(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/_control/state", timeout=10).json()

    def paths(self) -> list[str]:
        return [call["path"] for call in self.state()["calls"]]

    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def kill(self) -> None:
        self.broken = True
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGKILL: it holds no state worth a graceful exit, and a hung route would block one."""
        self.kill()


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--settings", type=Path, required=True)
    args = parser.parse_args()
    app = create_app(json.loads(args.settings.read_text()))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
