"""The policy the trainer updates: model and tokenizer, LoRA adapters, optimizer, master weights.

bfloat16 runs keep an fp32 master copy of every trainable parameter that is
stored narrower (`MasterWeights`): AdamW's steps at a typical RL learning rate
(1e-6) are far below half a bf16 ulp of most weights, so updating bf16 weights in
place rounds almost all of them away. The optimizer steps the fp32 copies and the
model (what the forward pass, DDP and checkpoints see) gets their bf16 rounding,
so small steps add up until they move the served weights.

A LoRA checkpoint holds merged weights for the engine plus the adapter itself
(`checkpoint.ADAPTER_DIR`); resuming puts that adapter back on the base model,
so the optimizer's saved moments meet the parameters they belong to.
"""

from __future__ import annotations

import importlib
import logging
import re
from pathlib import Path
from typing import Any

import torch

from atroposlib.utils.image_messages import is_vision_language
from example_trainer.checkpoint import ADAPTER_DIR
from example_trainer.config import LORA_MODES, TrainingConfig
from example_trainer.vision import freeze_vision_tower, vision_tower

logger = logging.getLogger("example_trainer")


def require(module: str, flag: str):
    """The module, or a SystemExit that says which pip package `flag` needs."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise SystemExit(f"{flag} needs the {module} package: pip install {module}") from exc


def build_optimizer(params: list[torch.nn.Parameter], config: TrainingConfig):
    """The optimizer `--optimizer` names, over `params` (the fp32 masters where there are any)."""
    if config.optim.optimizer == "adamw_8bit":
        bnb = require("bitsandbytes", "--optimizer adamw_8bit")

        return bnb.optim.AdamW8bit(params, lr=config.optim.lr)
    if config.optim.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=config.optim.lr, relative_step=False, scale_parameter=False)
    return torch.optim.AdamW(params, lr=config.optim.lr, weight_decay=0.0)


class MasterWeights:
    """fp32 copies of the trainable parameters stored in a narrower dtype.

    Parameters already in fp32 (all of them in an fp32 run, LoRA adapters, which
    peft keeps in fp32) are their own master and cost nothing.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.pairs = [
            (p, p if p.dtype == torch.float32 else torch.nn.Parameter(p.detach().float()))
            for p in model.parameters()
            if p.requires_grad
        ]

    @property
    def params(self) -> list[torch.nn.Parameter]:
        """What the optimizer steps."""
        return [master for _, master in self.pairs]

    def take_grads(self) -> None:
        """Move the model's gradients onto the masters, widened to fp32."""
        for param, master in self.pairs:
            if master is not param:
                master.grad = None if param.grad is None else param.grad.float()
                param.grad = None

    def stepped_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """A module whose named parameters are what the optimizer steps, under `model`'s
        names: `model` itself when its parameters are their own masters (fp32, FSDP),
        else a stand-in holding the fp32 masters. torch's optimizer state dicts name
        each parameter through a module (an FSDP checkpoint's optimizer/), and a bf16
        model's parameters are not what the optimizer steps (CK-1 of the trainer review:
        an FSDP checkpoint could not be resumed by a single-process bf16 run)."""
        if all(master is param for param, master in self.pairs):
            return model
        masters = {id(param): master for param, master in self.pairs}
        stand_in = torch.nn.Module()
        for name, param in model.named_parameters():
            if id(param) not in masters:
                continue
            *path, leaf = name.split(".")
            owner = stand_in
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, torch.nn.Module())
                owner = getattr(owner, part)
            owner.register_parameter(leaf, masters[id(param)])
        return stand_in

    @torch.no_grad()
    def publish(self) -> None:
        """Round the masters into the model's own parameters after an optimizer step."""
        for param, master in self.pairs:
            if master is not param:
                param.copy_(master)


def enable_gradient_checkpointing(model: Any) -> None:
    """Keep only each decoder layer's input and recompute the layer in backward: about one
    more forward pass of compute for activations that no longer grow with depth.
    Non-reentrant, so it needs no input that requires grad (LoRA's frozen embeddings)."""
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x's name
        model.activation_checkpointing_enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable({"use_reentrant": False})


def compute_dtype(config: TrainingConfig) -> torch.dtype:
    return torch.bfloat16 if config.model.dtype == "bfloat16" else torch.float32


def load_policy(config: TrainingConfig, device: torch.device, sharded: bool = False):
    """(model, tokenizer, restore_optimizer): the policy to train, on `device`.

    `restore_optimizer` is False only for an old LoRA checkpoint without its
    adapter: fresh adapters cannot take another adapter's moments. A model that FSDP
    will shard (`sharded`) loads in float32: its shards are the master weights.
    """
    model, tokenizer, restore_optimizer = _load(config, device, sharded)
    if config.model.disable_dropout:
        without_dropout(model)
    return model, tokenizer, restore_optimizer


def without_dropout(model: torch.nn.Module) -> None:
    """Every dropout of `model` at 0: its `nn.Dropout` modules (LoRA's among them) and
    the rates attention layers keep as floats (`attention_dropout`), which they apply
    in train mode (DROP-1 of the trainer review)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name, value in vars(module).items():
            if name.endswith("dropout") and isinstance(value, float):
                setattr(module, name, 0.0)


def auto_model_class(source: str) -> Any:
    """transformers' auto class for the checkpoint at `source`: image-text-to-text for a
    vision-language model (`vision.py`), else a causal LM."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision_language(source) else AutoModelForCausalLM


def load_pretrained(source: str, dtype: torch.dtype, device: torch.device) -> Any:
    """The model at `source` on `device`, loaded by its auto class."""
    return auto_model_class(source).from_pretrained(source, dtype=dtype).to(device)


def _load(config: TrainingConfig, device: torch.device, sharded: bool) -> tuple[Any, Any, bool]:
    model, tokenizer, restore = _load_weights(config, device, sharded)
    if config.model.freeze_vision_tower:
        frozen = freeze_vision_tower(model)
        if frozen:
            logger.info("vision tower frozen: %d parameters (--freeze-vision-tower)", frozen)
    return model, tokenizer, restore


def _load_weights(
    config: TrainingConfig, device: torch.device, sharded: bool
) -> tuple[Any, Any, bool]:
    from transformers import AutoTokenizer

    dtype = torch.float32 if sharded else compute_dtype(config)
    source = config.checkpoint.resume or config.model.model_name
    tokenizer = AutoTokenizer.from_pretrained(source)
    if config.weight_sync.weight_bridge_mode not in LORA_MODES:
        return load_pretrained(source, dtype, device), tokenizer, True
    from peft import LoraConfig, PeftModel, get_peft_model

    adapter = Path(config.checkpoint.resume) / ADAPTER_DIR if config.checkpoint.resume else None
    if adapter is not None and adapter.is_dir():
        # the checkpoint's weights already include the adapter: it goes on the base
        base = load_pretrained(config.model.model_name, dtype, device)
        model = PeftModel.from_pretrained(base, adapter, is_trainable=True)
        return model.to(device), tokenizer, True
    base = load_pretrained(source, dtype, device)
    tower = vision_tower(base)
    model = get_peft_model(
        base,
        LoraConfig(
            r=config.lora.lora_r,
            lora_alpha=config.lora.lora_alpha,
            lora_dropout=config.lora.lora_dropout,
            target_modules=config.lora.lora_target_modules.split(","),
            # a frozen picture encoder gets no adapters either: its q_proj is not the LM's
            exclude_modules=(
                rf"{re.escape(tower[0])}\..*"
                if tower is not None and config.model.freeze_vision_tower
                else None
            ),
            task_type="CAUSAL_LM",
        ),
    )
    if config.checkpoint.resume:
        logger.warning(
            "%s holds no LoRA adapter (%s/): training fresh adapters on its merged "
            "weights, with a fresh optimizer state",
            config.checkpoint.resume,
            ADAPTER_DIR,
        )
        return model, tokenizer, False
    return model, tokenizer, True
