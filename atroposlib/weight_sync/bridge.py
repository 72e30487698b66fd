"""How new weights reach the inference engine: `--weight-bridge-mode`.

Design decisions:
- Two families. Restart modes (`none`, upstream's default, also spelled
  `restart`; `lora_restart`) checkpoint and restart the engine every
  `--engine-restart-interval` steps: slow (seconds on a CPU, ~45 s for vLLM on a
  GPU) but works with any engine. Hot modes push weights into the running
  engine every `--weight-sync-interval` steps, with no restart and no outage:
  `hot_reload` (full weights, loaded from disk by the engine), `lora_only` (an
  adapter), `shared_vllm` (vLLM reads the trainer's GPU memory; GPU only).
- A hot push writes the policy to `<save_path>/live/step-N` in
  `save_pretrained` layout (with the tokenizer), so the same directory is what a
  crashed engine restarts from; only the newest two are kept. Pushes are not
  checkpoints: `--save-checkpoint-interval` decides those.
- Each engine kind takes weights its own way, along its route (`route.EngineRoute`,
  named by its kind in `atroposlib.inference.engines`): our CPU engine through its
  authenticated `/update_weights_from_disk` (`disk_reload.DiskReloadRoute`), vLLM
  through its own routes (`vllm.VllmRoute`). A LoRA run on an engine without
  adapter slots pushes the merged weights; on vLLM it loads the adapter.
- A push that fails raises `WeightSyncError`; the trainer then restarts the
  engine on the newest exported weights, so a failed push costs one restart,
  never the run.
- Several engines (`--num-engines`): one export per step, then one push per
  engine, all at once (`export`, `push`, `pushed`), so a step's sync costs the
  slowest engine's push, and a push that fails restarts only its own engine.
"""

from __future__ import annotations

import copy
import logging
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from atroposlib.weight_sync.errors import WeightSyncError
from atroposlib.weight_sync.modes import RESTART_MODES
from atroposlib.weight_sync.route import EngineRoute, HotMode, Push


@dataclass(frozen=True)
class BridgeSettings:
    """What a bridge reads of its trainer's settings; a trainer builds one from its own
    (the example trainer: `serving.bridge_settings`)."""

    weight_bridge_mode: str
    model_name: str
    served_model_name: str | None
    save_path: str
    """Hot exports go to <save_path>/live/step-N."""
    engine_port: int
    """The engine's port on 127.0.0.1."""
    weight_sync_timeout_s: float
    lora_r: int

    @property
    def restarts_engine(self) -> bool:
        """A restart mode: no hot bridge."""
        return self.weight_bridge_mode in RESTART_MODES


class ExportFailed(WeightSyncError):
    """The weights could not be written (a full disk): the engine never saw them, keeps
    serving what it had, and needs no restart."""


logger = logging.getLogger("atroposlib.weight_sync")

LIVE_DIR = "live"
KEEP_LIVE = 2


WeightGather = Callable[[], dict[str, torch.Tensor] | None]
"""A sharded trainer's whole weights by parameter name, on rank 0 (None on the other
ranks). A collective: every rank calls it at the same point of a push."""

WeightWriter = Callable[[Path, bool], None]
"""Writes the policy into a directory (`save_pretrained` layout; the adapter alone when
the flag says so). A trainer whose weights are sharded passes its own, which gathers."""


def write_weights(model: Any, tokenizer, staging: Path, adapter_only: bool) -> None:
    """The default `WeightWriter` for a model held whole: a transformers `PreTrainedModel`
    or a peft `PeftModel` (merged into a copy, unless `adapter_only`)."""
    if adapter_only:
        model.save_pretrained(staging)  # peft: adapter_config.json + adapter weights
        return
    merged = (
        copy.deepcopy(model).merge_and_unload() if hasattr(model, "merge_and_unload") else model
    )
    merged.save_pretrained(staging)
    tokenizer.save_pretrained(staging)


def export_weights(
    model: Any, tokenizer, target: Path, adapter_only: bool, write: WeightWriter | None = None
) -> Path:
    """Write what the engine loads to `target` (atomically: staged, then renamed)."""
    staging = target.with_name(f".{target.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    if write is None:
        write_weights(model, tokenizer, staging, adapter_only)
    else:
        write(staging, adapter_only)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


class EnginePush:
    """Pushes an exported directory into one running engine, along its kind's route."""

    def __init__(self, config: BridgeSettings, route: EngineRoute, sync_key: str) -> None:
        self.config = config
        self.route = route
        self.sync_key = sync_key

    @property
    def adapter_only(self) -> bool:
        """An engine that serves adapters takes LoRA's alone; another, merged weights."""
        return self.config.weight_bridge_mode == "lora_only" and self.route.takes_adapters

    def served_name(self, name: str) -> str:
        """What the engine serves its base model as (an adapter may take `name` itself)."""
        return self.route.served_name(name, self.adapter_only)

    def launch_extras(self) -> tuple[list[str], dict[str, str]]:
        """Flags and environment the engine must start with for this push to work."""
        mode: HotMode = "lora_only" if self.adapter_only else "hot_reload"
        return self.route.launch_extras(mode, self.sync_key, self.config.lora_r)

    def push(self, url: str, path: Path, version: str) -> float:
        served = self.config.served_model_name or self.config.model_name
        timeout = self.config.weight_sync_timeout_s
        push = Push(path, version, self.sync_key, timeout, served, self.adapter_only)
        return self.route.push(url, push)


class WeightBridge:
    """The seam: how a hot mode's weights reach a running engine. The defaults suit a
    bridge that pushes full weights and has nothing to set up or clean up."""

    push_at_start = False
    """Push right after the engine starts (an adapter to load, a handshake to make)."""

    pushes_from_export = False
    """The push reads only what `export` wrote, so it may run while the trainer changes
    its weights (the trainer then delivers it in the background)."""

    @property
    def restart_from(self) -> tuple[str, int] | None:
        """(path, step) of full weights a restarted engine can start on, if any."""
        return None

    pruned: list[Path] = []
    """Exports the last sync deleted (the engine must not fall back to them)."""

    def __init__(self, config: BridgeSettings) -> None:
        self.config = config

    def launch_extras(self) -> tuple[list[str], dict[str, str]]:
        """Flags and environment the engine must start with."""
        return [], {}

    def served_name(self, name: str) -> str:
        """The name the engine serves its base model as."""
        return name

    def engine_model(self, newest: str, base: str) -> str:
        """What the engine (re)starts on, given the newest weights and the base model."""
        return newest

    def engine_restarted(self) -> None:
        """A new engine process took the old one's place."""

    def export(
        self, model: torch.nn.Module, tokenizer, step: int, write: WeightWriter | None = None
    ) -> Path | None:
        """Write this step's weights where every engine can load them, once for all
        engines; None for a bridge that pushes from memory. Raises `ExportFailed`."""
        return None

    def push(self, exported: Path | None, step: int, url: str) -> float:
        """Push this step's weights into the engine at `url`; seconds spent. Raises
        `WeightSyncError`. Called for several engines at once, from several threads."""
        raise NotImplementedError

    def pushed(self) -> None:
        """Every engine has had this step's push (or a restart on it)."""

    def repush(self, url: str) -> float:
        """A restarted engine at `url` started on `engine_model`: push what that lacks
        (an adapter, shared memory); seconds spent. Never exports: rank 0 alone calls it."""
        return 0.0

    def close(self) -> None:
        """The run is over."""


class HotBridge(WeightBridge):
    """hot_reload and lora_only: export, push, keep the newest exports."""

    pushes_from_export = True  # the engines load the export from disk

    def __init__(self, config: BridgeSettings, route: EngineRoute) -> None:
        super().__init__(config)
        self.live = Path(config.save_path) / LIVE_DIR
        self.pusher = EnginePush(config, route, secrets.token_urlsafe(24))
        self.exports: list[Path] = []
        self.latest: tuple[str, int] | None = None
        self.pruned = []
        # an adapter must be loaded before environments ask for the policy's name
        self.push_at_start = self.pusher.adapter_only

    def launch_extras(self) -> tuple[list[str], dict[str, str]]:
        return self.pusher.launch_extras()

    def served_name(self, name: str) -> str:
        return self.pusher.served_name(name)

    def engine_model(self, newest: str, base: str) -> str:
        """The base under an adapter, else the newest weights."""
        return base if self.pusher.adapter_only else newest

    def export(
        self, model: torch.nn.Module, tokenizer, step: int, write: WeightWriter | None = None
    ) -> Path:
        target = self.live / f"step-{step}"
        try:
            path = export_weights(model, tokenizer, target, self.pusher.adapter_only, write)
        except OSError as exc:  # a full disk: the engines keep their weights, the run goes on
            raise ExportFailed(f"cannot write the weights to {self.live}: {exc}") from None
        self.exports.append(path)
        self.latest = (str(path), step)  # servable even if a push fails
        self.pruned = []
        return path

    def push(self, exported: Path | None, step: int, url: str) -> float:
        assert exported is not None  # export() always writes one
        return self.pusher.push(url, exported, str(step))

    def repush(self, url: str) -> float:
        """An engine restarted on the base model gets the newest adapter back."""
        if not self.pusher.adapter_only or self.latest is None:
            return 0.0
        path, step = self.latest
        return self.push(Path(path), step, url)

    def pushed(self) -> None:
        self.pruned = self.exports[:-KEEP_LIVE]
        for old in self.pruned:
            shutil.rmtree(old, ignore_errors=True)
        self.exports = self.exports[-KEEP_LIVE:]

    @property
    def restart_from(self) -> tuple[str, int] | None:
        return None if self.pusher.adapter_only else self.latest


class SharedBridge(WeightBridge):
    """shared_vllm: `atroposlib.weight_sync.vllm_ipc.SharedVLLMBridge` behind the seam. A
    restarted vLLM starts on a checkpoint and then gets the weights pushed.

    A sharded trainer (FSDP) passes `gather`: `export` gathers the whole weights once per
    push (every rank takes part), and the push shares those instead of the parameters. A
    restarted engine then serves its checkpoint until the next push, since rank 0 alone
    restarts it and cannot gather."""

    push_at_start = True  # connect (the handshake) before environments sample

    def __init__(
        self, config: BridgeSettings, model: torch.nn.Module, gather: WeightGather | None = None
    ) -> None:
        from atroposlib.weight_sync.vllm import weight_route_headers
        from atroposlib.weight_sync.vllm_ipc import SharedVLLMBridge, shared_vllm_launch_extras

        super().__init__(config)
        sync_key = secrets.token_urlsafe(24)
        self._extras = shared_vllm_launch_extras(sync_key)
        self.bridge = SharedVLLMBridge(
            f"http://127.0.0.1:{config.engine_port}",
            model,
            headers=weight_route_headers(sync_key),
            timeout_s=config.weight_sync_timeout_s,
        )
        self.connected = False
        self.pushed_step: int | None = None
        self.gather = gather
        self.staged: dict[str, torch.Tensor] | None = None  # this push's gathered weights

    def launch_extras(self) -> tuple[list[str], dict[str, str]]:
        return self._extras

    def engine_restarted(self) -> None:
        """A new engine process: the handshake starts over."""
        self.connected = False

    def push(self, exported: Path | None, step: int, url: str) -> float:
        """The one engine (shared_vllm refuses several) is the one `self.bridge` reaches."""
        if not self.connected:
            self.bridge.connect()
            self.connected = True
        spent = self.bridge.push(str(step), self.staged)
        self.pushed_step = step
        return spent

    def export(
        self, model: torch.nn.Module, tokenizer, step: int, write: WeightWriter | None = None
    ) -> Path | None:
        """Nothing goes to disk; a sharded trainer's weights are gathered here."""
        if self.gather is not None:
            self.staged = self.gather()
        return None

    def pushed(self) -> None:
        self.staged = None  # the engine has copied them

    def repush(self, url: str) -> float:
        """A restarted vLLM started on a checkpoint: share the current memory again."""
        if self.pushed_step is None or self.gather is not None:
            return 0.0
        return self.push(None, self.pushed_step, url)

    def close(self) -> None:
        if self.connected:
            self.bridge.close()


def build_bridge(
    config: BridgeSettings,
    engine: str,
    route: EngineRoute | None,
    model: torch.nn.Module,
    gather: WeightGather | None = None,
) -> WeightBridge | None:
    """The hot bridge for this run, or None for the restart modes. `engine` names the
    engine's kind and `route` is how it takes weights while it runs (None: it only
    restarts); `gather`: how a sharded trainer assembles its weights (`WeightGather`)."""
    mode = config.weight_bridge_mode
    if config.restarts_engine:
        return None
    if route is None:
        raise SystemExit(
            f"--weight-bridge-mode {mode}: the {engine} engine takes no new weights while it "
            "runs; use --weight-bridge-mode restart"
        )
    if mode == "shared_vllm":
        if not route.shares_memory:
            raise SystemExit(
                "--weight-bridge-mode shared_vllm needs vLLM on a CUDA GPU (trainer and engine "
                "on the same GPU); on a CPU use --weight-bridge-mode hot_reload"
            )
        return SharedBridge(config, model, gather)
    return HotBridge(config, route)
