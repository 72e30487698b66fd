"""`environments/verifiers_server.py`: a `verifiers` environment (the quickstart's task,
`environments/vf_mod_arithmetic`, installed in the dev venv) rolled out through the
env's ManagedServer against the real CPU engine, with upstream's flags."""

from __future__ import annotations

import signal

import pytest

from atroposlib.envs.cli import run_cli
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.protocol import ScoredData, group_problems
from environments.verifiers_server import (
    VerifiersEnv,
    VfEnvConfig,
    load_vf_environment,
)
from tests.support.compat_runs import read_jsonl

VF_ENV = "vf-mod-arithmetic"


def needs_verifiers() -> None:
    """verifiers itself (3 s to import) only where a test loads an environment."""
    pytest.importorskip("verifiers")


def test_env_args_are_a_json_object_or_a_mapping():
    assert VfEnvConfig(tokenizer_name="t", env_args='{"seed": 3}').get_env_args() == {"seed": 3}
    assert VfEnvConfig(tokenizer_name="t", env_args={"seed": 3}).get_env_args() == {"seed": 3}
    with pytest.raises(ValueError, match="not JSON"):
        VfEnvConfig(tokenizer_name="t", env_args="{seed: 3").get_env_args()
    with pytest.raises(ValueError, match="a JSON object"):
        VfEnvConfig(tokenizer_name="t", env_args="[1]").get_env_args()


@pytest.mark.integration
def test_loading_names_what_is_missing_and_keeps_this_processes_signal_handlers():
    needs_verifiers()
    with pytest.raises(ValueError, match="--env.vf_env_name is required"):
        load_vf_environment("", {})
    with pytest.raises(Exception, match="no_such_vf_env|Could not import"):
        load_vf_environment("no-such-vf-env", {})

    def mine(signum, frame):  # pragma: no cover - never delivered
        pass

    kept = signal.signal(signal.SIGTERM, mine)
    try:
        environment = load_vf_environment(VF_ENV, {"eval_size": 5})
        assert signal.getsignal(signal.SIGTERM) is mine, "verifiers' exit handler was left"
    finally:
        signal.signal(signal.SIGTERM, kept)
    assert len(environment.get_dataset()) == 100 and len(environment.get_eval_dataset()) == 5


def make_env(tiny_model_path, server, tmp_path, **fields) -> VerifiersEnv:
    config = VfEnvConfig(
        tokenizer_name=str(tiny_model_path),
        vf_env_name=VF_ENV,
        group_size=8,
        max_token_length=32,
        use_wandb=False,
        data_dir_to_save_evals=str(tmp_path / "evals"),
        **fields,
    )
    engine = APIServerConfig(
        model_name=server.name, base_url=f"{server.url}/v1", api_key="x", server_type="vllm"
    )
    return VerifiersEnv(config, [engine], testing=False)


@pytest.mark.integration
async def test_each_rollout_keeps_the_engines_tokens_and_its_own_score(
    tiny_model_path, inference_server, tmp_path
):
    """Rollouts finish in any order; each sequence still carries the score verifiers gave
    the reply in it, and its tokens and logprobs are the engine's (nothing re-tokenized)."""
    needs_verifiers()
    from transformers import AutoTokenizer
    from vf_mod_arithmetic import correct

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    env = make_env(tiny_model_path, inference_server, tmp_path)
    await env.setup()
    item = await env.get_next_item()
    group, backlog = await env.collect_trajectories(item)
    assert backlog == [] and len(group["tokens"]) == 8
    assert group_problems(ScoredData.model_validate(group)) == []
    prompt = tokenizer.apply_chat_template(
        item["prompt"], tokenize=False, add_generation_prompt=True
    )
    for tokens, masks, logprobs, score, messages in zip(
        group["tokens"],
        group["masks"],
        group["inference_logprobs"],
        group["scores"],
        group["messages"],
        strict=True,
    ):
        trained = [t for t, m in zip(tokens, masks, strict=True) if m != -100]
        reply = tokenizer.decode(trained, skip_special_tokens=True)
        assert tokenizer.decode(tokens[: len(tokens) - len(trained)]) == prompt
        assert score == correct([{"content": reply}], item["answer"])
        assert messages[-1] == {"role": "assistant", "content": reply}
        assert all(lp <= 0 for lp, m in zip(logprobs, masks, strict=True) if m != -100)
    assert set(env.reward_values) >= {"correct"}


@pytest.mark.integration
def test_process_writes_groups_and_evaluate_scores_the_eval_dataset(
    tiny_model_path, inference_server, tmp_path, monkeypatch
):
    needs_verifiers()
    monkeypatch.chdir(tmp_path)
    engine = [
        *("--openai.base_url", f"{inference_server.url}/v1"),
        *("--openai.model_name", inference_server.name),
        *("--env.tokenizer_name", str(tiny_model_path)),
        *("--env.vf_env_name", VF_ENV),
        *("--env.env_args", '{"eval_size": 6}'),
        *("--env.max_token_length", "32"),
    ]
    out = tmp_path / "groups.jsonl"
    run_cli(
        VerifiersEnv,
        ["process", *engine, "--env.total_steps", "2", "--env.group_size", "4"]
        + ["--env.data_path_to_save_groups", str(out)],
    )
    groups = read_jsonl(out)
    assert len(groups) == 2
    for group in groups:
        assert group_problems(ScoredData.model_validate(group)) == []
        assert set(group["scores"]) <= {0.0, 1.0} and len(group["tokens"]) == 4
    evals = tmp_path / "evals"
    run_cli(VerifiersEnv, ["evaluate", *engine, "--env.data_dir_to_save_evals", str(evals)])
    results = read_jsonl(evals / "samples.jsonl")
    assert len(results) == 6
    metrics = (evals / "metrics.json").read_text()
    assert "eval/accuracy" in metrics and "eval/correct" in metrics
