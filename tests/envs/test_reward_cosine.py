"""The cosine_scaled reward on a real (tiny, locally built) Hugging Face model.

Upstream defaults to a hub model that cannot be downloaded here, so every test names the
tiny model; the expected similarity is recomputed from the model's own hidden states.
"""

from __future__ import annotations

import numpy as np
import pytest

from atroposlib.envs.reward_fns import registry

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _embedding(model_path: str, text: str) -> np.ndarray:
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_path)
    model = transformers.AutoModel.from_pretrained(model_path)
    encoded = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**encoded).last_hidden_state[0]
    return hidden.mean(dim=0).numpy().astype(np.float64)


def _expected(model_path: str, solution: str, completion: str, scale: float = 1.0) -> float:
    a, b = _embedding(model_path, solution), _embedding(model_path, completion)
    distance = 1.0 - a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
    return float(min(1.0, max(-1.0, 1.0 - scale * distance)))


@pytest.fixture
def model_path(tiny_model_path) -> str:
    return str(tiny_model_path)


def test_cosine_scaled_scores_similarity_to_the_solution(model_path):
    solution = "What is 3 + 4 mod 10? 7"
    other = "The quick brown fox jumps over the lazy dog"
    reward = registry.create({"type": "cosine_scaled", "params": {"model_name": model_path}})
    scores = reward([solution, {"role": "assistant", "content": other}], solution=solution)
    assert scores[0] == pytest.approx(1.0, abs=1e-5)
    assert scores[1] == pytest.approx(_expected(model_path, solution, other), abs=1e-5)
    assert scores[1] < scores[0]


def test_cosine_scaled_scale_and_clipping(model_path):
    solution, other = "What is 3 + 4 mod 10? 7", "The quick brown fox jumps over the lazy dog"
    scaled = registry.create("cosine_scaled", model_name=model_path, scale_factor=3.0)
    assert scaled.compute([other], solution=solution) == pytest.approx(
        [_expected(model_path, solution, other, scale=3.0)], abs=1e-5
    )
    capped = registry.create("cosine_scaled", model_name=model_path, max_reward=0.5)
    assert capped.compute([solution], solution=solution) == [0.5]
    floored = registry.create(
        "cosine_scaled", model_name=model_path, scale_factor=1e6, min_reward=-0.25
    )
    assert floored.compute([other], solution=solution) == [-0.25]


def test_cosine_scaled_defaults_without_solution_or_model(model_path, tmp_path):
    reward = registry.create("cosine_scaled", model_name=model_path, default_reward=0.3)
    assert reward.compute(["anything", "else"]) == [0.3, 0.3]
    assert reward.compute(["anything"], solution="") == [0.3]
    missing = registry.create(
        "cosine_scaled", model_name=str(tmp_path / "no-model"), default_reward=-0.5
    )
    assert missing.compute(["anything"], solution="something") == [-0.5]
