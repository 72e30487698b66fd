"""`atroposlib.envs.eval`: pass@k, the lighteval-shaped result files, and `EvalBase` runs
against the real CPU inference server."""

from __future__ import annotations

import asyncio
import json
import math
import sys

import pytest

from atroposlib.envs.eval import EvalBase, eval_runner, evaluate_log, pass_at_k
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.server_handling.server_manager import ServerManager


@pytest.mark.parametrize(
    ("n", "c", "k"),
    [(1, 0, 1), (1, 1, 1), (4, 1, 1), (4, 1, 2), (10, 3, 5), (16, 0, 4), (100, 7, 10), (8, 6, 3)],
)
def test_pass_at_k_matches_the_closed_form(n, c, k):
    expected = 1.0 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_pass_at_k_refuses_impossible_counts():
    with pytest.raises(ValueError, match="correct samples out of only"):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="k >= 1"):
        pass_at_k(3, 1, 0)


def test_evaluate_log_writes_lighteval_shaped_files(tmp_path, capsys):
    metrics = {"eval/percent_correct": 0.625, "eval/avg_len": 12.0}
    samples = [{"messages": [{"role": "user", "content": "2+2"}], "score": 1.0}, {"score": 0}]
    out = tmp_path / "evals" / "run1"
    evaluate_log(
        metrics,
        eval_dir=str(out),
        task_name="gsm8k",
        model_name="tiny",
        start_time=100.0,
        end_time=112.5,
        generation_parameters={"temperature": 0.0, "max_tokens": 8},
        samples=samples,
        verbose=True,
    )
    document = json.loads((out / "metrics.json").read_text())
    assert document == {
        "config_general": {
            "model_name": "tiny",
            "total_evaluation_time_seconds": "12.5",
            "generation_parameters": {"temperature": 0.0, "max_tokens": 8},
        },
        "results": {"atropos|gsm8k|0": metrics, "all": metrics},
    }
    lines = (out / "samples.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == samples
    table = capsys.readouterr().out
    assert "Evaluation Results: gsm8k" in table
    rows = [line for line in table.splitlines() if line.startswith("|gsm8k")]
    assert len(rows) == 2
    assert "percent correct" in rows[0] and "↑" in rows[0] and "0.6250" in rows[0]
    assert "avg len" in rows[1] and "12.0000" in rows[1]
    assert "Evaluation completed in 12.50 seconds" in table


def test_evaluate_log_without_a_directory_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    evaluate_log({"acc": 1.0}, task_name="t", samples=[{"a": 1}], verbose=False)
    assert list(tmp_path.iterdir()) == []
    evaluate_log({"acc": 1.0}, eval_dir=str(tmp_path / "e"), task_name="t", verbose=False)
    assert sorted(p.name for p in (tmp_path / "e").iterdir()) == ["metrics.json"]
    written = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert written["config_general"]["generation_parameters"] == {}


def test_evaluate_log_writes_numpy_numbers_as_plain_json(tmp_path, capsys):
    """numpy's int64 and float32 are no Python numbers: json.dump raised on them."""
    import numpy as np

    metrics = {"eval/accuracy": np.float32(0.5), "eval/correct": np.int64(3)}
    evaluate_log(
        metrics,
        eval_dir=str(tmp_path),
        task_name="t",
        samples=[{"score": np.float64(1.0), "tokens": np.array([1, 2])}],
        verbose=True,
    )
    document = json.loads((tmp_path / "metrics.json").read_text())
    assert document["results"]["all"] == {"eval/accuracy": 0.5, "eval/correct": 3}
    sample = json.loads((tmp_path / "samples.jsonl").read_text())
    assert sample == {"score": 1.0, "tokens": [1, 2]}
    assert "0.5000" in capsys.readouterr().out


def parity(text: str) -> float:
    """A deterministic score that differs between samples of the tiny model."""
    return 1.0 if len(text) % 2 == 0 else 0.0


class TinyParityEval(EvalBase):
    """Upstream's pass@n pattern (aime24_hermes_example.py) with a toy score."""

    def setup_data(self) -> list:
        self.seen: dict[str, list[str]] = {}
        return [{"question": q} for q in ("2 + 3 =", "7 - 4 =", "Name a color:")]

    async def run_item(self, server, data_item):
        messages = [{"role": "user", "content": data_item["question"]}]
        completion = await self.chat_completion(server, messages)
        texts = [choice.message.content for choice in completion.choices]
        self.seen[data_item["question"]] = texts
        rewards = [parity(text) for text in texts]
        n = self.get_generation_params()["n"]
        key = f"pass@{self.pass_at_n}" + (f":{n}" if n != self.pass_at_n else "")
        samples = [
            {"messages": messages, "answer": text, "score": reward}
            for text, reward in zip(texts, rewards, strict=True)
        ]
        return {key: pass_at_k(n, sum(rewards), self.pass_at_n), "samples": len(texts)}, samples


def tiny_manager(server) -> ServerManager:
    return ServerManager(
        [
            APIServerConfig(
                model_name=server.name, base_url=f"{server.url}/v1", api_key="x", timeout=120
            )
        ]
    )


async def test_eval_base_runs_every_item_and_logs_pass_at_n(inference_server, tmp_path):
    evaluation = TinyParityEval(
        pass_at_n=2,
        pass_at_n_samples=4,
        temperature=1.0,
        max_tokens=4,
        eval_dir=str(tmp_path / "out"),
    )
    metrics = await evaluation(tiny_manager(inference_server))

    assert sorted(evaluation.seen) == sorted(d["question"] for d in evaluation.data)
    per_item = [
        pass_at_k(4, sum(parity(t) for t in texts), 2) for texts in evaluation.seen.values()
    ]
    assert all(len(texts) == 4 for texts in evaluation.seen.values())
    assert metrics == {"pass@2:4": pytest.approx(sum(per_item) / 3), "samples": 4.0}

    document = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert set(document["results"]) == {"atropos|TinyParityEval@2:4|0", "all"}
    assert document["results"]["all"] == pytest.approx(metrics)
    assert document["config_general"]["model_name"] == inference_server.name
    assert document["config_general"]["generation_parameters"] == {
        "temperature": 1.0,
        "n": 4,
        "top_p": 1.0,
        "max_tokens": 4,
    }
    assert float(document["config_general"]["total_evaluation_time_seconds"]) > 0
    lines = (tmp_path / "out" / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 3
    answers = {tuple(s["answer"] for s in json.loads(line)) for line in lines}
    assert answers == {tuple(texts) for texts in evaluation.seen.values()}


async def test_eval_runner_takes_the_server_from_the_command_line(
    inference_server, tmp_path, monkeypatch
):
    evaluation = TinyParityEval(max_tokens=3, eval_dir=str(tmp_path))
    argv = ["eval.py", "--server-url", f"{inference_server.url}/v1", "--model-name", "tiny"]
    monkeypatch.setattr(sys, "argv", argv)
    metrics = await eval_runner(evaluation)
    assert set(metrics) == {"pass@1", "samples"} and metrics["samples"] == 1.0
    document = json.loads((tmp_path / "metrics.json").read_text())
    assert document["config_general"]["model_name"] == "tiny"
    assert "atropos|TinyParityEval@1|0" in document["results"]


def test_eval_base_without_items_says_so():
    class Empty(TinyParityEval):
        def setup_data(self):
            return []

    with pytest.raises(ValueError, match="no items"):
        asyncio.run(Empty()(ServerManager([APIServerConfig(base_url="http://127.0.0.1:9/v1")])))


def test_a_served_evaluation_is_added_to_the_history_with_its_step(tmp_path):
    import numpy as np

    from atroposlib.envs.eval import EVAL_HISTORY, append_eval_history

    append_eval_history(str(tmp_path), 20, "t", {"eval/accuracy": np.float64(0.75)})
    append_eval_history(str(tmp_path), 40, "t", {"eval/accuracy": 0.8})
    records = [json.loads(line) for line in (tmp_path / EVAL_HISTORY).read_text().splitlines()]
    assert [(r["step"], r["metrics"]["eval/accuracy"]) for r in records] == [(20, 0.75), (40, 0.8)]
