"""An upstream gsm8k_server-style env (ManagedServer, `n=group_size`) run unchanged.

It writes groups with `process`, run as upstream runs it (twice: the second run must
not overwrite the first). It serves a real run-api and trainer stand-in from the CPU
inference server, and its `evaluate` subcommand on a local eval set must leave
upstream's metrics.json / samples.jsonl in `--env.data_dir_to_save_evals`: those two
are its rows of the env table (tests/environments/test_env_table.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support.compat_runs import read_jsonl, run_env_ok, tiny_flags
from tests.support.env_table import (
    EvaluateRow,
    Run,
    ServeRow,
    compat_env,
    read_evaluation,
    tiny_engine,
)

pytest.importorskip("torch")

SCRIPT = "gsm8k_local_server.py"
TRAIN = [("What is 1 + 1?", 2), ("What is 2 + 3?", 5), ("What is 4 + 4?", 8)]
EVAL = [("What is 6 + 1?", 7), ("What is 9 - 2?", 7)]


def write_rows(path: Path, rows: list[tuple[str, int]]) -> Path:
    path.write_text(
        "".join(json.dumps({"question": q, "answer": f"work\n#### {a}"}) + "\n" for q, a in rows)
    )
    return path


def data_flags(workdir: Path) -> list[str]:
    workdir.mkdir(parents=True, exist_ok=True)
    train = write_rows(workdir / "train.jsonl", TRAIN)
    test = write_rows(workdir / "test.jsonl", EVAL)
    return ["--env.train_file", str(train), "--env.eval_file", str(test)]


def check_managed_sequence(tokens: list[int], masks: list[int], logprobs: list[float]) -> int:
    """Prompt first (masked, logprob 1.0), then the sampled tokens; returns the prompt length."""
    assert len(tokens) == len(masks) == len(logprobs)
    prompt = [i for i, m in enumerate(masks) if m == -100]
    assert prompt == list(range(len(prompt))) and len(prompt) < len(tokens)
    assert all(logprobs[i] == 1.0 for i in prompt)
    assert all(
        masks[i] == tokens[i] and logprobs[i] <= 0.0 for i in range(len(prompt), len(tokens))
    )
    return len(prompt)


def test_process_writes_jsonl_and_html_and_keeps_an_earlier_run(
    inference_server, tiny_model_path, tmp_path
):
    args = [
        *data_flags(tmp_path),
        *tiny_flags(tiny_model_path, f"{inference_server.url}/v1", server_type="vllm"),
        *("--env.total_steps", "2", "--env.data_path_to_save_groups", "out/gsm8k.jsonl"),
    ]
    run_env_ok(SCRIPT, "process", tmp_path, *args)  # writes gsm8k.jsonl
    run_env_ok(SCRIPT, "process", tmp_path, *args)  # must pick gsm8k_1.jsonl
    for stem in ("gsm8k", "gsm8k_1"):
        groups = read_jsonl(tmp_path / "out" / f"{stem}.jsonl")
        assert len(groups) == 2, stem
        for group in groups:
            assert len(group["tokens"]) == 2
            sequences = zip(
                group["tokens"], group["masks"], group["inference_logprobs"], strict=True
            )
            for seq in sequences:
                check_managed_sequence(*seq)
        page = (tmp_path / "out" / f"{stem}.html").read_text()
        assert groups[0]["messages"][0][1]["content"] in page
    assert not (tmp_path / "out" / "gsm8k_2.jsonl").exists()


def check_serve(groups: list[dict], run: Run) -> None:
    questions = {q for q, _ in TRAIN}
    for group in groups:
        assert set(group["scores"]) <= {1.0, -1.0}
        for tokens, masks, logprobs, messages in zip(
            group["tokens"],
            group["masks"],
            group["inference_logprobs"],
            group["messages"],
            strict=True,
        ):
            prompt_len = check_managed_sequence(tokens, masks, logprobs)
            assert messages[1]["content"] in questions
            assert messages[1]["content"] in run.tokenizer.decode(tokens[:prompt_len])
            assert messages[-1]["role"] == "assistant"


def check_evaluate(results: dict, samples: list[dict], run: Run) -> None:
    metrics, _ = read_evaluation(run)
    assert set(metrics) == {"config_general", "results"}
    general = metrics["config_general"]
    assert general["model_name"] == "tiny"
    assert float(general["total_evaluation_time_seconds"]) >= 0.0
    # the env's own parameters, over the config's max_new_tokens (upstream's merge)
    assert general["generation_parameters"] == {
        "max_new_tokens": 300,
        "temperature": 0.0,
        "max_tokens": 7,
    }
    assert set(metrics["results"]) == {"atropos|gsm8k_local_eval|0", "all"}
    assert results == metrics["results"]["atropos|gsm8k_local_eval|0"]
    assert results["eval/num_samples"] == len(EVAL)
    assert 0.0 <= results["eval/percent_correct"] <= 1.0
    assert sorted(s["question"] for s in samples) == sorted(q for q, _ in EVAL)
    assert all(s["messages"][-1]["role"] == "assistant" for s in samples)
    assert sum(s["score"] for s in samples) / len(samples) == results["eval/percent_correct"]
    # upstream's evaluate also records the resolved config beside the results
    dumped = yaml.safe_load((run.tmp_path / "evals" / "evaluate_config.yaml").read_text())
    assert dumped["env"]["eval_file"].endswith("test.jsonl")
    assert dumped["env"]["max_answer_tokens"] == 7
    servers = dumped["openai"] if isinstance(dumped["openai"], list) else [dumped["openai"]]
    assert servers[0]["base_url"] == run.model.url


# Its rows of the env table (tests/environments/test_env_table.py): `serve` to a real
# run-api and trainer stand-in from the CPU inference server; `evaluate` on a local eval
# set, which must leave upstream's metrics.json / samples.jsonl.
ENV = compat_env(SCRIPT, "GSM8kLocalEnv")
SERVE = ServeRow(
    env=ENV,
    model=tiny_engine,
    group_size=2,
    batch_size=4,
    max_token_len=2048,
    groups=4,
    args=lambda run: [
        *data_flags(run.tmp_path / "data"),
        *("--env.ensure_scores_are_not_same", "false"),
    ],
    check=check_serve,
)
EVALUATE = EvaluateRow(
    env=ENV,
    model=tiny_engine,
    samples=len(EVAL),
    args=lambda run: [
        *data_flags(run.tmp_path / "data"),
        *("--env.max_answer_tokens", "7", "--env.eval_temperature", "0.0"),
        *("--env.max_token_length", "300"),
    ],
    check=check_evaluate,
)
