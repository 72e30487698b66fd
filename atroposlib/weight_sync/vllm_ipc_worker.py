"""Runs inside the vLLM engine's workers: tells the trainer which physical GPU each one is on.

CUDA IPC handles only open on the GPU that exported them, and vLLM's IPC backend
keys every handle by the exporting GPU's UUID (vllm/distributed/weight_transfer/
ipc_engine.py:222-230). vLLM's HTTP server reports no GPU UUID (its /server_info
strips them, vllm/collect_env.py:217-222), so `SharedVLLMBridge.connect` asks the
workers through vLLM's `--worker-extension-cls` hook (vllm/v1/worker/
worker_base.py:296-321) and the dev-mode `/collective_rpc` route
(vllm/entrypoints/serve/dev/rpc/api_router.py:23-59).

Imports nothing but torch, so the engine's interpreter needs only this repository
on its PYTHONPATH (`shared_vllm_launch_extras` puts it there), not atroposlib's deps.
"""

from __future__ import annotations

import torch

DEVICE_UUID_METHOD = "atropos_device_uuid"


class SharedVLLMWorkerExtension:
    """Mixed into vLLM's GPU worker class; every method becomes a collective_rpc target."""

    def atropos_device_uuid(self) -> str:
        """The UUID of this worker's GPU, computed exactly as vLLM's IPC backend does."""
        device = self.device  # type: ignore[attr-defined]  # set by vLLM's Worker.init_device
        return str(torch.cuda.get_device_properties(device.index).uuid)
