"""Pushing new weights into a running vLLM (0.32) instead of restarting it.

Design decisions:
- Full reload uses vLLM's own in-place reload from disk, `Worker.reload_weights(
  weights_path=...)`, reached over HTTP through the dev-mode `/collective_rpc`
  route. It reads the same `save_pretrained` directory a restart would, needs no
  package of ours inside vLLM's venv and no GPU transport: the weight-transfer
  backends (`/update_weights`: nccl, ipc, ...) move tensors from a live trainer
  over NCCL or CUDA IPC, and none of them reads a checkpoint directory.
- Requests in flight finish on the old weights: `/pause?mode=wait` lets running
  requests finish, queues new ones and clears the prefix cache; the reload and
  `/update_weight_version` follow, and `/resume` (always sent, even after a
  failure) serves the queued requests on the new weights. No request fails.
- The checkpoint is checked before anything is sent. In vLLM 0.32 a reload that
  fails half way leaves parameters on the meta device and the engine dies on its
  next step, so a missing, partial or mismatched checkpoint (tensor names and
  shapes against the checkpoint vLLM started from, when that is readable here)
  is refused with `WeightSyncError` while the old weights keep serving.
- LoRA: vLLM resolves a request's model name to an adapter first and refuses an
  adapter named like a base model, so the base is served as `<name>-base`
  (`lora_base_name`) and the adapter is loaded under `<name>`, in place
  (`load_inplace`: same adapter slot, new path). Prefix-cache keys include the
  adapter path, and the pause clears the cache anyway, so nothing stale is reused.
- vLLM's `--api-key` guards only /v1, /v2, /inference and /cohere, so the dev-mode
  routes used here (/pause, /collective_rpc, ...) get a key of their own:
  `vllm_route_guard.WeightRouteGuard`, which vLLM loads through its `--middleware`
  flag. The trainer makes the key, hands it to the engine in its environment and
  sends it with every call here (`weight_route_headers`). The engine also binds
  127.0.0.1, and `engine_args` may not change that.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import httpx

from atroposlib.utils.exposure import ENGINE_KEY_ENVIRONMENT, key_from_environment
from atroposlib.weight_sync.errors import WeightSyncError
from atroposlib.weight_sync.route import Push
from atroposlib.weight_sync.vllm_route_guard import SYNC_KEY_HEADER, guard_launch_extras

# vLLM 0.32's LoRAConfig.max_lora_rank accepts only these (vllm/config/lora.py).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
LORA_BASE_SUFFIX = "-base"
RESUME_TIMEOUT_S = 30.0
DEV_MODE_HINT = (
    "start vLLM with the flags and env of vllm_launch_extras(...) (VLLM_SERVER_DEV_MODE=1, "
    "the weight-route guard and its key)"
)
LORA_HINT = "start vLLM with vllm_launch_extras('lora_only') (--enable-lora, runtime LoRA env)"


def vllm_launch_extras(
    mode: Literal["hot_reload", "lora_only"], sync_key: str, lora_rank: int = 16
) -> tuple[list[str], dict[str, str]]:
    """Extra vLLM flags and environment the engine needs for `mode`'s pushes to work.

    Both modes need the dev-mode routes (/pause, /resume, /update_weight_version,
    /weight_info; /collective_rpc for the full reload), behind the guard keyed with
    `sync_key`. `lora_only` also needs runtime LoRA; its adapters must have rank <=
    `lora_rank`, and the engine must serve the base under `lora_base_name(name)`.
    """
    guard_args, guard_env = guard_launch_extras(sync_key)
    env = {"VLLM_SERVER_DEV_MODE": "1", **guard_env}
    if mode == "hot_reload":
        return guard_args, env
    if mode != "lora_only":
        raise ValueError(f"mode must be 'hot_reload' or 'lora_only', not {mode!r}")
    max_rank = next((rank for rank in VLLM_LORA_RANKS if rank >= lora_rank), None)
    if lora_rank < 1 or max_rank is None:
        raise ValueError(f"lora_rank must be between 1 and {VLLM_LORA_RANKS[-1]}, not {lora_rank}")
    args = ["--enable-lora", "--max-lora-rank", str(max_rank), "--max-loras", "1"]
    return [*guard_args, *args], {**env, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


def weight_route_headers(sync_key: str) -> dict[str, str]:
    """What the trainer sends on the weight routes: the weight-sync key, which alone
    opens them (the route guard), and in `Authorization` the engine's API key when it has
    one (vLLM's own check on /v1/load_lora_adapter wants it), else the sync key again.
    Every POST says JSON, a body or not, as the guard asks of every listener."""
    token = key_from_environment(ENGINE_KEY_ENVIRONMENT) or sync_key
    return {
        "Authorization": f"Bearer {token}",
        SYNC_KEY_HEADER: sync_key,
        "Content-Type": "application/json",
    }


def lora_base_name(served_model_name: str) -> str:
    """The name the base model is served under in `lora_only` mode."""
    return served_model_name + LORA_BASE_SUFFIX


def reload_vllm_weights(
    url: str,
    model_path: str,
    weight_version: str,
    headers: dict | None = None,
    timeout_s: float = 120,
) -> float:
    """Replace every weight of the running vLLM at `url` with `model_path`'s; seconds spent."""
    started = time.perf_counter()
    path = Path(model_path).resolve()
    with _Engine(url, headers, timeout_s) as engine:
        new_shapes = checkpoint_shapes(path)
        served = engine.served_root()
        if served is not None and served != path:
            _check_same_tensors(new_shapes, checkpoint_shapes(served), path, served)
        with engine.paused():
            rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
            engine.post("/collective_rpc", "reloading the weights", json=rpc)
            engine.set_version(weight_version)
    return time.perf_counter() - started


def load_vllm_lora(
    url: str,
    served_model_name: str,
    adapter_path: str,
    weight_version: str,
    headers: dict | None = None,
    timeout_s: float = 120,
) -> float:
    """Serve the peft adapter at `adapter_path` under `served_model_name`, replacing the last
    one; seconds spent."""
    started = time.perf_counter()
    path = Path(adapter_path).resolve()
    _check_adapter(path)
    body = {"lora_name": served_model_name, "lora_path": str(path), "load_inplace": True}
    with _Engine(url, headers, timeout_s) as engine, engine.paused():
        engine.post("/v1/load_lora_adapter", "loading the LoRA adapter", json=body, hint=LORA_HINT)
        engine.set_version(weight_version)
    return time.perf_counter() - started


class VllmRoute:
    """vLLM's routes: in-place reload from disk, or a runtime LoRA adapter."""

    takes_adapters = True
    shares_memory = True

    def launch_extras(
        self, mode: Literal["hot_reload", "lora_only"], sync_key: str, lora_rank: int
    ) -> tuple[list[str], dict[str, str]]:
        return vllm_launch_extras(mode, sync_key, lora_rank)

    def served_name(self, name: str, adapter: bool) -> str:
        return lora_base_name(name) if adapter else name

    def push(self, url: str, push: Push) -> float:
        headers = weight_route_headers(push.sync_key)
        path, version, timeout = str(push.path), push.version, push.timeout_s
        if push.adapter:
            return load_vllm_lora(url, push.served, path, version, headers, timeout)
        return reload_vllm_weights(url, path, version, headers, timeout)


def checkpoint_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of a `save_pretrained` directory, read from safetensors headers."""
    if not path.is_dir():
        raise WeightSyncError(f"{path}: no such checkpoint directory")
    if not (path / "config.json").is_file():
        raise WeightSyncError(f"{path}: no config.json, not a save_pretrained checkpoint")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightSyncError(f"{path}: holds no *.safetensors weights")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        shapes.update(safetensors_shapes(file))
    return shapes


def safetensors_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes from a safetensors file's JSON header (8-byte length, then JSON):
    no tensor is read."""
    try:
        with open(file, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        return {
            name: tuple(info["shape"]) for name, info in header.items() if name != "__metadata__"
        }
    except (OSError, struct.error, ValueError, KeyError, TypeError) as exc:
        raise WeightSyncError(f"{file}: unreadable safetensors file ({exc})") from None


def _check_same_tensors(
    new: dict[str, tuple[int, ...]],
    served: dict[str, tuple[int, ...]],
    path: Path,
    served_path: Path,
) -> None:
    differences = [
        f"{name}: {served.get(name, 'absent')} served, {new.get(name, 'absent')} new"
        for name in sorted(new.keys() | served.keys())
        if new.get(name) != served.get(name)
    ]
    if differences:
        raise WeightSyncError(
            f"{path} does not match the architecture vLLM serves ({served_path}): "
            f"{len(differences)} tensors differ, e.g. " + "; ".join(differences[:5])
        )


def _check_adapter(path: Path) -> None:
    if not (path / "adapter_config.json").is_file():
        raise WeightSyncError(f"{path}: no adapter_config.json, not a peft adapter directory")
    weights = ("adapter_model.safetensors", "adapter_model.bin")
    if not any((path / name).is_file() for name in weights):
        raise WeightSyncError(f"{path}: holds no adapter_model.safetensors or adapter_model.bin")


class _Engine:
    """One vLLM server, spoken to within one deadline; every failure is a WeightSyncError."""

    def __init__(self, url: str, headers: dict | None, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.client = httpx.Client(base_url=self.url, headers=headers or {})

    def __enter__(self) -> _Engine:
        return self

    def __exit__(self, *exc_info) -> None:
        self.client.close()

    def request(
        self, method: str, path: str, what: str, hint: str = DEV_MODE_HINT, **kwargs
    ) -> httpx.Response:
        remaining = kwargs.pop("timeout", None) or self.deadline - time.monotonic()
        if remaining <= 0:
            raise WeightSyncError(f"{what}: out of time ({self.timeout_s:g}s) before asking vLLM")
        try:
            response = self.client.request(method, path, timeout=remaining, **kwargs)
        except httpx.TimeoutException:
            raise WeightSyncError(
                f"{what}: vLLM at {self.url} gave no answer to {path} within {remaining:.0f}s"
            ) from None
        except httpx.HTTPError as exc:
            raise WeightSyncError(f"{what}: cannot reach vLLM at {self.url}: {exc}") from None
        if response.status_code == 404 and _route_missing(response):
            raise WeightSyncError(f"{what}: vLLM at {self.url} has no {path} route; {hint}")
        if response.status_code >= 400:
            raise WeightSyncError(
                f"{what}: vLLM answered {path} with {response.status_code}: {response.text[:800]}"
            )
        return response

    def post(self, path: str, what: str, **kwargs) -> httpx.Response:
        return self.request("POST", path, what, **kwargs)

    def served_root(self) -> Path | None:
        """The checkpoint vLLM started from, when it is a directory readable here."""
        models = self.request("GET", "/v1/models", "reading the served model").json()
        roots = [m.get("root") for m in models.get("data", []) if not m.get("parent")]
        root = Path(roots[0]) if roots and roots[0] else None
        return root.resolve() if root is not None and root.is_dir() else None

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Generation paused once requests in flight finish; resumed on the way out, always."""
        try:
            self.post("/pause", "pausing generation", params={"mode": "wait"})
        except WeightSyncError:
            try:  # a pause that timed out here may still take effect there
                self._resume()
            except WeightSyncError:
                pass
            raise
        try:
            yield
        except WeightSyncError as exc:
            try:
                self._resume()
            except WeightSyncError as resume_error:
                raise WeightSyncError(f"{exc}; and then {resume_error}") from None
            raise
        else:
            self._resume()

    def _resume(self) -> None:
        self.post("/resume", "resuming generation", timeout=RESUME_TIMEOUT_S)

    def set_version(self, weight_version: str) -> None:
        body = {"new_version": weight_version}
        self.post("/update_weight_version", "setting the weight version", json=body)
        served = self.request("GET", "/weight_info", "reading the weight version").json()
        if served.get("weight_version") != weight_version:
            raise WeightSyncError(
                f"vLLM reports weight version {served.get('weight_version')!r} "
                f"after it was set to {weight_version!r}"
            )


def _route_missing(response: httpx.Response) -> bool:
    """FastAPI's own 404 (no such route), as opposed to a route's 404 (no such adapter)."""
    try:
        return response.json() == {"detail": "Not Found"}
    except ValueError:
        return False
