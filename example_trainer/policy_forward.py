"""`PolicyForward`: the policy's forward as the loss calls it, wrapped for the ranks.

One rank runs the plain module; several run it under DDP (each holds the whole
model) or FSDP2 (`--parallelism fsdp`, each holds shards). Its gradient sync happens
once a step, after the last micro-batch, and a rank whose share of a batch ran out
still runs an idle pass for every collective the others make. Which micro-batch
layouts the forward takes (packed rows, a shared prompt) is decided here, once, from
the model: the trainer's loop only asks.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch

from example_trainer.config import TrainingConfig
from example_trainer.distributed import DataParallel
from example_trainer.logprobs import PolicyLogprobs, packs_micro_batches
from example_trainer.model import compute_dtype
from example_trainer.reference import ReferencePolicy
from example_trainer.sharding import shard
from example_trainer.vision import vision_tower

logger = logging.getLogger("example_trainer")


def say_padded_rows(config: TrainingConfig) -> None:
    """A vision-language policy trains on padded rows: the layouts that cut rows apart
    (packing, the shared-prompt forward) would part image tokens from their pixels."""
    batching = config.batching
    if batching.micro_batch_tokens is not None and batching.padding_free == "on":
        logger.warning("--padding-free on: a vision-language policy trains on padded rows")
    if batching.shared_prompt_forward:
        logger.warning(
            "--shared-prompt-forward: a vision-language policy runs each row whole "
            "(its prompt holds the picture's tokens)"
        )


class PolicyForward:
    """See the module docstring. Build it before anything else shards the model."""

    def __init__(
        self,
        model: Any,
        config: TrainingConfig,
        parallel: DataParallel,
        device: torch.device,
        sharded: bool,
    ) -> None:
        batching = config.batching
        self.sees_pictures = vision_tower(model) is not None
        if self.sees_pictures:
            say_padded_rows(config)
        # before sharding: every rank probes its whole model
        self.packs = not self.sees_pictures and packs_micro_batches(
            model, batching.micro_batch_tokens, batching.padding_free
        )
        self.shares_prompts = batching.shared_prompt_forward and not (
            self.sees_pictures
            or self.packs
            or batching.logprob_chunk_tokens
            or config.loss.entropy_coef > 0
            or (config.loss.distill_coef > 0 and config.loss.distill_mode == "forward_topk")
            or config.model.gradient_checkpointing
        )
        # what the loss calls: the policy answering token logprobs (chunked or whole)
        logprobs = PolicyLogprobs(
            model, batching.logprob_chunk_tokens, with_entropy=config.loss.entropy_coef > 0
        )
        self.ddp = None
        self.fsdp: Any = None  # the sharded root (an FSDPModule) under --parallelism fsdp
        if sharded:
            offload = config.parallel.fsdp_cpu_offload
            self.fsdp = shard(logprobs, model, compute_dtype(config), offload)
        elif parallel.enabled:
            from torch.nn.parallel import DistributedDataParallel

            device_ids = [device.index] if device.type == "cuda" else None
            self.ddp = DistributedDataParallel(logprobs, device_ids=device_ids)
        self.module = self.ddp or logprobs
        self.device = device

    def __call__(self, *inputs: Any, **named: Any) -> Any:
        return self.module(*inputs, **named)

    def gradient_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """Gradients are reduced across ranks once a step, after the last micro-batch."""
        if self.fsdp is not None:
            self.fsdp.set_requires_gradient_sync(last)
        if last or self.ddp is None:
            return contextlib.nullcontext()
        return self.ddp.no_sync()

    def idle_pass(self, last: bool, pad_id: int, reference: ReferencePolicy | None) -> None:
        """A forward and backward that add nothing: FSDP gathers each layer collectively,
        so a rank with fewer micro-batches than another still runs as many passes."""
        with self.gradient_sync(last):
            ids = torch.full((1, 2), pad_id, device=self.device)
            output = self.module(ids, torch.ones_like(ids))
            if reference is not None:
                reference.logprobs(ids, torch.ones_like(ids))
            logp = output["logprobs"] if isinstance(output, dict) else output
            (logp.sum() * 0.0).backward()
