"""Registered as "cosine_scaled": embedding similarity between completion and solution.

Embeddings are the mean-pooled last hidden states of a Hugging Face encoder, cached on
the class so every instance (and every batch) shares one loaded model; asking for a
different model replaces the cache. A model that cannot be loaded does not fail the
reward: every completion gets `default_reward`, as upstream does. The cosine distance is
computed with numpy (upstream used scipy for the same formula).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from .registry import registry
from .reward_function import RewardFunction

try:
    import torch
    from transformers import AutoModel, AutoTokenizer
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "the cosine_scaled reward needs torch and transformers (pip install torch transformers)"
    ) from exc

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


@registry.register
class CosineScaledReward(RewardFunction):
    """`1 - scale_factor * cosine_distance`, clipped to [min_reward, max_reward]."""

    _model: Any = None
    _tokenizer: Any = None
    _model_name: str = DEFAULT_MODEL

    def __init__(
        self,
        model_name: str | None = None,
        scale_factor: float = 1.0,
        min_reward: float = -1.0,
        max_reward: float = 1.0,
        default_reward: float = 0.0,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.model_name = model_name or self._model_name
        self.scale_factor = scale_factor
        self.min_reward = min_reward
        self.max_reward = max_reward
        self.default_reward = default_reward
        self._ensure_model_loaded()

    def _ensure_model_loaded(self) -> None:
        cls = CosineScaledReward
        if cls._model is not None and self.model_name == cls._model_name:
            return
        try:
            cls._tokenizer = AutoTokenizer.from_pretrained(self.model_name)
            cls._model = AutoModel.from_pretrained(self.model_name)
            cls._model_name = self.model_name
            logger.info("loaded embedding model %s", self.model_name)
        except Exception:
            logger.exception("could not load embedding model %s", self.model_name)
            cls._tokenizer = cls._model = None

    def _get_embeddings(self, text: str) -> np.ndarray | None:
        """Mean-pooled embedding of `text` (shape (1, hidden)), or None without a model."""
        model, tokenizer = CosineScaledReward._model, CosineScaledReward._tokenizer
        if model is None or tokenizer is None:
            return None
        try:
            encoded = tokenizer(text, padding=True, truncation=True, return_tensors="pt")
            with torch.no_grad():
                hidden = model(**encoded)[0]
            mask = encoded["attention_mask"].unsqueeze(-1).expand(hidden.size()).float()
            pooled = (hidden * mask).sum(1) / torch.clamp(mask.sum(1), min=1e-9)
            return pooled.numpy()
        except Exception:
            logger.exception("could not embed a text")
            return None

    def compute(
        self, completions: list[Any], solution: str | Any | None = None, **kwargs: Any
    ) -> list[float]:
        """Similarity rewards; `default_reward` for all when there is no solution or model."""
        contents = [self.get_content(c) for c in completions]
        if not solution:
            logger.warning("cosine_scaled reward got no solution; using default_reward")
            return [self.default_reward] * len(contents)
        solution_text = solution if isinstance(solution, str) else self.get_content(solution)
        solution_embedding = self._get_embeddings(solution_text)
        return [self._score(solution_embedding, content) for content in contents]

    def _score(self, solution_embedding: np.ndarray | None, content: str) -> float:
        embedding = self._get_embeddings(content)
        if solution_embedding is None or embedding is None:
            return self.default_reward
        distance = cosine_distance(solution_embedding.ravel(), embedding.ravel())
        similarity = 1.0 - distance * self.scale_factor
        return min(self.max_reward, max(self.min_reward, similarity))


def cosine_distance(u: np.ndarray, v: np.ndarray) -> float:
    """1 - cos(u, v): 0 for the same direction, 2 for opposite ones, NaN for a zero vector.

    A NaN distance ends up as `min_reward` after clipping, as with upstream's scipy call.
    """
    u64, v64 = u.astype(np.float64), v.astype(np.float64)
    norms = float(np.linalg.norm(u64) * np.linalg.norm(v64))
    if norms == 0.0:
        return float("nan")
    return float(np.clip(1.0 - float(np.dot(u64, v64)) / norms, 0.0, 2.0))


def cosine_scaled_reward(
    completions: list[Any], solution: Any = None, **kwargs: Any
) -> list[float]:
    """Function form of `CosineScaledReward().compute`."""
    return CosineScaledReward().compute(completions, solution=solution, **kwargs)
