"""Weight sync: how a trainer's new weights reach a running inference engine, in one place.

Any trainer can use it; the trainer decides only *when* to sync.

- `bridge`: the seam (`WeightBridge`), the hot bridges (`HotBridge`: export and push,
  `SharedBridge`: vLLM reads the trainer's GPU memory) and `build_bridge`, which picks
  one from a trainer's settings (`BridgeSettings`);
- `modes`: the `--weight-bridge-mode` choices, which modes restart the engine;
- `route`: `EngineRoute`, how one kind of engine takes weights while it runs.
- Disk reload, for this project's CPU engine, the sender and the receiver side by side:
  - `disk_reload`: the engine's all-or-nothing reload, and the trainer's
    `push_to_cpu_engine`;
  - `disk_routes`: the engine's `POST /update_weights_from_disk` and `GET /weight_info`.
- vLLM:
  - `vllm`: vLLM's own reload and runtime-LoRA routes, and the flags the engine needs;
  - `vllm_route_guard`: the middleware that keeps those routes behind the sync key;
  - `vllm_ipc`, `vllm_ipc_mapping`, `vllm_ipc_worker`: CUDA IPC sharing of the
    trainer's weights with vLLM on one GPU.
- `versions`: the label of the weights that sampled each completion, which groups
  carry to the trainer.
- `errors`: `WeightSyncError`, what every failed sync raises.
"""
