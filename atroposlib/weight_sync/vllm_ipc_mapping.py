"""shared_vllm's parameter mapping: trainer parameter names to vLLM checkpoint names.

Pure functions, separately tested. vLLM's IPC weight transfer hands the names it
receives to the model's `load_weights`, the checkpoint loader, so it expects
Hugging Face checkpoint names and fuses q/k/v and gate/up itself (vLLM 0.32:
distributed/weight_transfer/ipc_engine.py:218-245, model_executor/models/llama.py:348-356).
The trainer's names only need the wrappers taken off: DDP's `module.`,
torch.compile's `_orig_mod.`, peft's `base_model.model.` and `base_layer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from atroposlib.weight_sync.errors import WeightSyncError
from atroposlib.weight_sync.vllm import safetensors_shapes


class SharedVLLMSetupError(WeightSyncError):
    """The engine or the trainer is set up so that shared_vllm cannot work; retrying won't help."""


WRAPPER_PREFIXES = ("module.", "_orig_mod.", "base_model.model.")
LORA_SEGMENTS = frozenset(
    {"lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector"}
)
# checkpoint tensors vLLM drops on load (model_executor/models/utils.py:233, 471)
IGNORED_CHECKPOINT_SUFFIXES = ("rotary_emb.inv_freq",)
SHOWN_MISMATCHES = 5


def engine_name(trainer_name: str) -> str | None:
    """The checkpoint name vLLM's `load_weights` expects for a trainer parameter, or None to skip.

    Strips DDP's `module.`, torch.compile's `_orig_mod.` and peft's
    `base_model.model.` prefixes and peft's `base_layer` / `modules_to_save.<adapter>`
    segments; LoRA adapter tensors and peft's frozen `original_module` copies are
    skipped (shared_vllm pushes full weights).
    """
    name = trainer_name
    stripped = True
    while stripped:
        stripped = False
        for prefix in WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, stripped = name[len(prefix) :], True
    parts: list[str] = []
    segments = iter(name.split("."))
    for segment in segments:
        if segment in LORA_SEGMENTS or segment == "original_module":
            return None
        if segment == "base_layer":
            continue
        if segment == "modules_to_save":
            next(segments, None)  # the adapter's name
            continue
        parts.append(segment)
    return ".".join(parts)


def engine_weights(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """(checkpoint name, parameter) for every weight to push, in the model's order.

    A parameter reachable under several names (tied embeddings) is pushed once,
    under its non-`lm_head` name: vLLM ties `lm_head` to the embedding itself.
    """
    names_by_param: dict[int, list[str]] = {}
    params: dict[int, torch.nn.Parameter] = {}
    for trainer_name, param in model.named_parameters(remove_duplicate=False):
        name = engine_name(trainer_name)
        if name is None:
            continue
        names_by_param.setdefault(id(param), []).append(name)
        params[id(param)] = param
    out: list[tuple[str, torch.nn.Parameter]] = []
    seen: set[str] = set()
    for key, names in names_by_param.items():
        untied = [n for n in names if not n.startswith("lm_head.")] or names
        name = untied[0]
        if name in seen:
            raise ValueError(f"two trainer parameters map onto the engine name {name!r}")
        seen.add(name)
        out.append((name, params[key]))
    return out


def trainable_adapters(model: torch.nn.Module) -> list[str]:
    """Trainer parameters that train but would never reach the engine (LoRA adapters)."""
    return [
        name
        for name, param in model.named_parameters()
        if param.requires_grad and engine_name(name) is None
    ]


def checkpoint_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} from a safetensors checkpoint's headers (no tensor is read)."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise SharedVLLMSetupError(
            f"the engine's model directory {model_dir} holds no *.safetensors files, so the "
            "trainer cannot check its parameter names against the engine's"
        )
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        shapes.update(safetensors_shapes(file))
    return shapes


def mapping_mismatches(
    weights: Sequence[tuple[str, torch.Tensor]],
    checkpoint: dict[str, tuple[int, ...]],
    engine_dtype: torch.dtype | None,
) -> list[str]:
    """Human-readable mismatches between what the trainer would push and what the engine loads."""
    pushed = {name for name, _ in weights}
    problems: list[str] = []
    unknown = [name for name, _ in weights if name not in checkpoint]
    missing = [
        name
        for name in checkpoint
        if name not in pushed
        and not name.endswith(IGNORED_CHECKPOINT_SUFFIXES)
        and not (name.startswith("lm_head.") and _tied_head_pushed(name, pushed, checkpoint))
    ]
    shapes = [
        f"{name}: trainer {tuple(t.shape)} vs engine {checkpoint[name]}"
        for name, t in weights
        if name in checkpoint and tuple(t.shape) != checkpoint[name]
    ]
    dtypes = [
        f"{name}: trainer {_dtype_name(t.dtype)} vs engine {_dtype_name(engine_dtype)}"
        for name, t in weights
        if engine_dtype is not None and t.dtype != engine_dtype
    ]
    for label, found in (
        ("not in the engine's checkpoint", unknown),
        ("in the engine's checkpoint but not in the trainer", missing),
        ("shape differs", shapes),
        ("dtype differs (start trainer and engine with the same --dtype)", dtypes),
    ):
        if found:
            more = (
                f" (+{len(found) - SHOWN_MISMATCHES} more)" if len(found) > SHOWN_MISMATCHES else ""
            )
            problems.append(f"{label}: {', '.join(found[:SHOWN_MISMATCHES])}{more}")
    return problems


def _tied_head_pushed(name: str, pushed: set[str], checkpoint: dict) -> bool:
    """A checkpoint's `lm_head.weight` is covered when the trainer ties it to the embedding."""
    embed = [n for n in pushed if n.endswith("embed_tokens.weight")]
    return bool(embed) and checkpoint.get(name) == checkpoint.get(embed[0])


def _dtype_name(dtype: torch.dtype | None) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(value: Any) -> torch.dtype | None:
    """vLLM's /server_info dumps model_config.dtype as e.g. 'torch.bfloat16'."""
    if not isinstance(value, str):
        return None
    found = getattr(torch, value.removeprefix("torch."), None)
    return found if isinstance(found, torch.dtype) else None
