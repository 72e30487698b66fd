"""The reference policy a KL penalty pulls toward, when the trainer computes it itself.

`--kl-reference env` (the default, as upstream) takes the environment's
`ref_logprobs`. `--kl-reference model` has the trainer compute them, as TRL does for
its `beta`:

- under LoRA, the base model is the reference: the policy's own forward with its
  adapters switched off (peft's `disable_adapter`), so it costs no memory;
- otherwise a frozen copy of `--model-name`, loaded from it (a resumed run keeps the
  same reference, not its checkpoint), in eval mode and the training dtype, and under
  FSDP sharded like the policy.

Its logprobs come from the same forward path as the policy's (`PolicyLogprobs`,
chunked alike) under `torch.no_grad()`. Under FSDP every rank runs the same number of
reference passes, since each gathers parameters collectively (`Trainer.idle_micro_batch`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from example_trainer.config import LORA_MODES, TrainingConfig
from example_trainer.logprobs import PolicyLogprobs
from example_trainer.model import compute_dtype, load_pretrained
from example_trainer.sharding import shard


class ReferencePolicy:
    """Token logprobs of the reference policy for a micro-batch."""

    def __init__(self, config: TrainingConfig, policy: Any, forward_policy: Any, device) -> None:
        """`policy`: the trained model (peft under LoRA); `forward_policy`: the module the
        loss calls for it (DDP or FSDP around `PolicyLogprobs`)."""
        self.lora = config.weight_sync.weight_bridge_mode in LORA_MODES
        self.policy = policy
        if self.lora:
            self.forward: Any = forward_policy
            return
        dtype = compute_dtype(config)
        frozen = load_pretrained(config.model.model_name, dtype, device)
        frozen.requires_grad_(False)
        frozen.eval()
        self.forward = PolicyLogprobs(frozen, config.batching.logprob_chunk_tokens)
        if config.parallel.parallelism == "fsdp":
            self.forward = shard(self.forward, frozen, dtype, config.parallel.fsdp_cpu_offload)

    @torch.no_grad()
    def logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None = None,
        pixels: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        adapters_off = self.policy.disable_adapter() if self.lora else contextlib.nullcontext()
        with adapters_off:
            out = self.forward(input_ids, attention_mask, position_ids, pixels=pixels)
        return (out[0] if isinstance(out, tuple) else out).float()
