"""Images in the trainer: a vision-language policy's pixel inputs, built by its own processor.

Design decisions:
- A group's tokens are the ones the engine sampled from, image tokens already expanded
  by the model's processor (the environment's or the engine's, see
  `atroposlib.utils.tokenize_images`). The trainer never expands anything itself: it
  runs the same processor on the group's `images` (upstream's field, base64 pictures)
  for the pixel inputs (pixel_values and whatever else the model's processor makes:
  Idefics3's pixel_attention_mask, Qwen2-VL's image_grid_thw, whose M-RoPE positions
  the model then computes itself).
- Every sequence is checked first: it must hold exactly as many image tokens as the
  processor expands its pictures to. Another processor, another resolution setting or a
  cut at --seq-len would put image features at the wrong positions (or crash the
  model's merge deep in a forward), so such a group is skipped with both counts named.
- Micro-batches with pictures are padded rows: packed rows and the shared-prompt forward
  cut rows apart, and pixels belong to whole rows (`PolicyForward` says so at start).
- The vision tower is frozen by default (`--freeze-vision-tower`), as TRL and verl do:
  an RL signal of one scalar per completion is too thin to retrain a picture encoder,
  and its weights then need not travel with each hot reload.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from atroposlib.utils.image_messages import decode_picture, pixel_inputs, vision_processor

logger = logging.getLogger("example_trainer")

VISION_TOWER_NAMES = ("vision_model", "vision_tower", "visual", "vision_encoder")
"""Where transformers' VLMs keep their picture encoder (Idefics3/SmolVLM, LLaVA and
Gemma 3, Qwen2-VL, Pixtral-style), under the model or its `model`."""


def vision_tower(model: Any) -> tuple[str, nn.Module] | None:
    """(dotted name, module) of `model`'s picture encoder, or None for a text model."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for prefix, owner in (("", base), ("model.", getattr(base, "model", None))):
        for name in VISION_TOWER_NAMES:
            module = getattr(owner, name, None) if owner is not None else None
            if isinstance(module, nn.Module):
                return prefix + name, module
    return None


def freeze_vision_tower(model: Any) -> int:
    """Stop gradients into the picture encoder; the number of parameters frozen."""
    found = vision_tower(model)
    if found is None:
        return 0
    frozen = 0
    for param in found[1].parameters():
        if param.requires_grad:
            param.requires_grad_(False)
            frozen += param.numel()
    return frozen


def multimodal_backbone(model: Any) -> nn.Module:
    """The module that maps ids and pixels to the last hidden state (the chunked-logprobs
    path's trunk): the VLM's inner `model`, which merges image features; `get_decoder()`
    is the language model alone and never sees a picture."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model


def sequence_pictures(group: Any, index: int) -> tuple[str, ...]:
    """Sequence `index`'s pictures from a group's `images`: one per sequence (upstream's
    multimodal environments: a string, or None) or a list per sequence."""
    images = group.images
    if not images or index >= len(images) or images[index] is None:
        return ()
    entry = images[index]
    return (entry,) if isinstance(entry, str) else tuple(entry)


ImageCheck = Callable[[list[int], tuple[str, ...]], str | None]
"""Why a sequence's image tokens do not fit its pictures, or None (`VisionInputs.problem`)."""


def check_pictures(index: int, group: Any, image_check: ImageCheck) -> None:
    """Raise `ValueError` naming the first sequence whose image tokens miss its pictures."""
    for i, tokens in enumerate(group.tokens):
        problem = image_check(tokens, sequence_pictures(group, i))
        if problem:
            raise ValueError(f"group {index} sequence {i}: {problem}")


class VisionInputs:
    """The policy's processor, for checking image tokens and making pixel inputs."""

    CACHED_PICTURES = 512

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.image_token = processor.image_token
        self.image_token_id = processor.tokenizer.convert_tokens_to_ids(self.image_token)
        self._pictures: dict[str, Any] = {}
        self._expansions: dict[tuple[tuple[int, int], ...], int] = {}

    @classmethod
    def for_model(cls, source: str) -> VisionInputs | None:
        """The processor of the vision-language model at `source`, or None for a text model."""
        processor = vision_processor(source)
        return None if processor is None else cls(processor)

    def pictures(self, images: Sequence[str]) -> list[Any]:
        """Decoded, with a group's shared picture decoded once."""
        if len(self._pictures) > self.CACHED_PICTURES:
            self._pictures.clear()
        for data in images:
            if not isinstance(data, str) or data not in self._pictures:  # a list: refused
                self._pictures[data] = decode_picture(data)
        return [self._pictures[data] for data in images]

    def expansion(self, images: Sequence[str]) -> int:
        """How many image tokens the processor expands these pictures to."""
        pictures = self.pictures(images)
        sizes = tuple(picture.size for picture in pictures)
        if sizes not in self._expansions:
            ids = self.processor(text=[self.image_token * len(pictures)], images=[pictures])
            self._expansions[sizes] = list(ids["input_ids"][0]).count(self.image_token_id)
        return self._expansions[sizes]

    def problem(self, tokens: Sequence[int], images: Sequence[str]) -> str | None:
        """Why a sequence's image tokens do not fit its pictures, or None."""
        try:
            expected = self.expansion(images) if images else 0
        except ValueError as bad:
            return str(bad)
        found = sum(1 for token in tokens if token == self.image_token_id)
        if found == expected:
            return None
        return (
            f"it holds {found} image tokens ({self.image_token}) but the policy's processor "
            f"expands its {len(images)} picture(s) to {expected}: the environment's tokens "
            "must be the engine's, expanded by this model's processor (a text-only "
            "tokenizer, another processor or a cut at --seq-len gives other counts)"
        )

    def tensors(self, rows: Sequence[Sequence[str]], dtype: torch.dtype) -> dict[str, Any]:
        """The processor's pixel inputs for a micro-batch's rows, floats in `dtype`."""
        return pixel_inputs(self.processor, [self.pictures(row) for row in rows], dtype)
