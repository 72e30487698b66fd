"""The black-box agent environment: its agent knows only the openai SDK, its rollouts go
through proxy sessions (its own in-process proxy, or a running atropos-proxy named by
ATROPOS_PROXY_URL, upstream's idiom), and its groups hold the agent's whole conversation."""

from __future__ import annotations

import httpx
import pytest

from environments.agent_mod_arithmetic import AgentModArithmeticEnv, score
from tests.support.env_table import EvaluateRow, Run, tiny_engine
from tests.support.library_envs import process_groups
from tests.support.proxy import ProxyProcess, proxy_config

transformers = pytest.importorskip("transformers")


def engine_flags(url: str) -> list[str]:
    return [
        *("--openai.base_url", f"{url}/v1", "--openai.model_name", "tiny"),
        *("--openai.server_type", "vllm"),
    ]


def test_grading():
    assert score("7", {"a": 3, "b": 4}) == 1.0
    assert score("7", {"a": 9, "b": 9}) == 0.0 and score("", {"a": 0, "b": 0}) == 0.0


def check_groups(groups: list[dict], tokenizer) -> None:
    assert groups
    for group in groups:
        for tokens, masks, logprobs in zip(
            group["tokens"], group["masks"], group["inference_logprobs"], strict=True
        ):
            assert len(tokens) == len(masks) == len(logprobs)
            text = tokenizer.decode(tokens)
            assert "mod 10" in text, "the agent's question is in the trained sequence"
            trained = [m for m in masks if m != -100]
            assert trained, "the agent's answers are trained"
            assert all(lp <= 0 for lp, m in zip(logprobs, masks, strict=True) if m != -100)
        assert set(group["scores"]) <= {0.0, 1.0}


@pytest.mark.integration
def test_process_runs_the_agent_through_its_own_proxy(inference_server, tiny_model_path, tmp_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_path)
    groups = process_groups(
        "agent_mod_arithmetic.py",
        tmp_path,
        tiny_model_path,
        engine_flags(inference_server.url),
        group_size=4,
        steps=2,
    )
    check_groups(groups, tokenizer)


@pytest.mark.integration
def test_process_uses_a_running_proxy_named_by_atropos_proxy_url(
    inference_server, tiny_model_path, tmp_path
):
    """Upstream's idiom: ATROPOS_PROXY_URL, and every session is deleted when done."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_path)
    proxy = ProxyProcess(proxy_config(tiny_model_path, inference_server.url), tmp_path)
    try:
        flags = engine_flags(inference_server.url)
        groups = process_groups(
            "agent_mod_arithmetic.py",
            tmp_path / "run",
            tiny_model_path,
            [*flags, "--env.proxy_url", proxy.url],
            group_size=4,
            steps=2,
        )
        check_groups(groups, tokenizer)
        health = httpx.get(f"{proxy.url}/health", timeout=10).json()
        assert health["sessions"] == 0, "a finished rollout's session was left behind"
    finally:
        proxy.stop()


def check_evaluate(results: dict, samples: list[dict], run: Run) -> None:
    assert results["eval/accuracy"] == pytest.approx(sum(s["score"] for s in samples) / 5)


# Its row of the env table (tests/environments/test_env_table.py): `evaluate` asks the
# agent greedily, on the tiny model.
EVALUATE = EvaluateRow(
    env=AgentModArithmeticEnv,
    model=tiny_engine,
    samples=5,
    args=lambda run: ["--env.eval_size", "5"],
    check=check_evaluate,
)
