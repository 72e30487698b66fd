"""Loading new weights into a model that is serving: the CPU engine's hot reload, and
the trainer's side of it (`push_to_cpu_engine`, `DiskReloadRoute`); the HTTP route
between them is `disk_routes`.

Design decisions:
- The new weights come from a directory on disk in `save_pretrained`'s layout
  (`*.safetensors`, one file or shards; `pytorch_model*.bin` as a fallback), the
  same thing a restart would load, so a trainer can point either mode at the
  same checkpoint. Reading it costs milliseconds for the tiny model and is what
  SGLang's `/update_weights_from_disk` does.
- All or nothing: every tensor is read and checked (names, shapes) before the
  first one is copied, so a bad or truncated checkpoint leaves the old weights
  serving. Tensors the model ties to another (`lm_head` on a tied-embedding
  model) may be absent from the file, as `save_pretrained` leaves them out.
- The copy is in place (`param.copy_`), so the engine keeps its model object,
  its KV-cache code and its threads; the caller holds the engine's generation
  lock, so a round in flight finishes on the old weights and the next starts on
  the new ones.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import torch

from atroposlib.utils.http_client import shared_http_client
from atroposlib.weight_sync.errors import WeightSyncError
from atroposlib.weight_sync.route import HotMode, Push


class WeightLoadError(ValueError):
    """The checkpoint cannot replace the served weights; the message says why."""


def read_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a `save_pretrained` directory (or a single .safetensors file)."""
    path = Path(path)
    if path.is_file() and path.suffix == ".safetensors":
        files = [path]
    elif path.is_dir():
        files = sorted(path.glob("*.safetensors")) or sorted(path.glob("pytorch_model*.bin"))
    else:
        raise WeightLoadError(f"{path}: no such checkpoint directory or .safetensors file")
    if not files:
        raise WeightLoadError(f"{path}: holds no *.safetensors or pytorch_model*.bin weights")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            if file.suffix == ".safetensors":
                from safetensors.torch import load_file

                tensors.update(load_file(str(file)))
            else:
                tensors.update(torch.load(file, map_location="cpu", weights_only=True))
        except Exception as exc:  # a truncated or foreign file: say which
            raise WeightLoadError(f"{file}: unreadable ({type(exc).__name__}: {exc})") from None
    return tensors


def _tied_to_loaded(model: torch.nn.Module, names: set[str]) -> set[str]:
    """Names of the model's tensors that share storage with one of `names`."""
    state = model.state_dict()
    pointers = {state[name].data_ptr() for name in names if name in state}
    return {name for name, tensor in state.items() if tensor.data_ptr() in pointers}


def check_compatible(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Raise `WeightLoadError` naming the first mismatches; nothing is copied."""
    state = model.state_dict()
    unknown = sorted(set(tensors) - set(state))
    if unknown:
        raise WeightLoadError(
            f"{len(unknown)} tensors the served model does not have, e.g. {unknown[:3]}"
        )
    wrong = [
        f"{name}: {tuple(tensor.shape)} for {tuple(state[name].shape)}"
        for name, tensor in tensors.items()
        if tensor.shape != state[name].shape
    ]
    if wrong:
        raise WeightLoadError(f"shapes differ from the served model's: {'; '.join(wrong[:3])}")
    # ENG-2: NaN weights were taken, and every request then failed; int64 tensors of the
    # right shape were cast silently
    kinds = [
        f"{name}: {tensor.dtype} for {state[name].dtype}"
        for name, tensor in tensors.items()
        if tensor.is_floating_point() != state[name].is_floating_point()
    ]
    if kinds:
        raise WeightLoadError(f"dtypes differ in kind from the served model's: {kinds[:3]}")
    broken = [
        name
        for name, tensor in tensors.items()
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())
    ]
    if broken:
        raise WeightLoadError(f"{len(broken)} tensors hold NaN or infinity, e.g. {broken[:3]}")
    missing = sorted(set(state) - _tied_to_loaded(model, set(tensors)))
    if missing:
        raise WeightLoadError(
            f"{len(missing)} of the model's tensors are missing, e.g. {missing[:3]}"
        )


@torch.no_grad()
def copy_into(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy checked tensors over the model's own, converting dtype as needed."""
    state = model.state_dict()
    for name, tensor in tensors.items():
        state[name].copy_(tensor)


def push_to_cpu_engine(url: str, path: Path, version: str, key: str, timeout_s: float) -> float:
    """`POST /update_weights_from_disk` on atropos-inference-server; seconds it took."""
    started = time.perf_counter()
    try:
        response = shared_http_client().post(
            f"{url}/update_weights_from_disk",
            json={"model_path": str(path), "weight_version": version},
            headers={"Authorization": f"Bearer {key}"},
            timeout=timeout_s,
        )
    except httpx.HTTPError as exc:
        raise WeightSyncError(f"cannot push weights to the engine at {url}: {exc!r}") from None
    if not response.is_success:
        raise WeightSyncError(
            f"the engine refused the weights (HTTP {response.status_code}): {response.text[:300]}"
        )
    return time.perf_counter() - started


class DiskReloadRoute:
    """`atropos-inference-server`'s route: full weights from disk, never an adapter
    alone (a LoRA run pushes its merged weights), keyed by the sync key."""

    takes_adapters = False
    shares_memory = False

    def launch_extras(
        self, mode: HotMode, sync_key: str, lora_rank: int
    ) -> tuple[list[str], dict[str, str]]:
        from atroposlib.weight_sync.disk_routes import WEIGHT_SYNC_KEY_ENVIRONMENT  # imports us

        return [], {WEIGHT_SYNC_KEY_ENVIRONMENT: sync_key}

    def served_name(self, name: str, adapter: bool) -> str:
        return name

    def push(self, url: str, push: Push) -> float:
        return push_to_cpu_engine(url, push.path, push.version, push.sync_key, push.timeout_s)
