"""Fixed groups to feed the example trainer directly, as `/batch` would serve them,
and a small trainer on the tiny model to feed them to."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def batch() -> list[dict]:
    tokens = [[1, 5, 6, 7, 2], [1, 5, 6, 8, 2]]
    return [
        {
            "tokens": tokens,
            "masks": [[-100, -100, 6, 7, 2], [-100, -100, 6, 8, 2]],
            "scores": [1.0, 0.0],
        }
    ]


PROMPT = [1, 5, 6]


def rollout_group(**fields: Any) -> dict[str, Any]:
    """Two sequences: a 3-token prompt (masked, logprob placeholder 1.0), 2 trained tokens.

    `fields` replace or add group fields (advantages, ref_logprobs, scores...).
    """
    tokens = [PROMPT + [7, 2], PROMPT + [8, 2]]
    return {
        "tokens": tokens,
        "masks": [[-100] * 3 + t[3:] for t in tokens],
        "scores": [1.0, 0.0],
        "inference_logprobs": [[1.0] * 3 + [-0.4, -0.2], [1.0] * 3 + [-1.5, -0.3]],
        **fields,
    }


def post_groups(client, count: int, **fields: Any) -> None:
    for _ in range(count):
        assert client.post("/scored_data", json=rollout_group(**fields)).is_success


def make_trainer(model: Path, save: Path, **overrides: Any) -> Any:
    """A trainer on `model` with no engine, small and on one thread; `overrides` are
    TrainingConfig fields. Imported here so that this module does not need torch."""
    from example_trainer.config import TrainingConfig
    from example_trainer.grpo import Trainer

    settings = {
        "model_name": str(model),
        "save_path": str(save),
        "device": "cpu",
        "inference_engine": "none",
        "lr": 1e-3,
        "batch_size": 2,
        "seq_len": 32,
        "num_threads": 1,
        "served_model_name": "tiny",
        **overrides,
    }
    return Trainer(TrainingConfig(**settings))


def hot_trainer(model: Path, save: Path, api_url: str, **overrides: Any) -> Any:
    """`make_trainer` pulling from the API at `api_url`, with a real CPU engine it pushes
    its weights into (hot reload)."""
    from atroposlib.utils.ports import free_port

    settings = {
        "inference_engine": "transformers",
        "weight_bridge_mode": "hot_reload",
        "vllm_port": free_port(),
        "atropos_url": api_url,
        **overrides,
    }
    return make_trainer(model, save, **settings)
