"""The GSM8K environment: its grader, and a real `process` run on a local dataset."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from environments.gsm8k_server import parse_number, reference_answer, score

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("so she has 18 - 2 = 16 eggs. \\boxed{16}", 16.0),
        ("The answer is 1,234.", 1234.0),
        ("\\boxed{7} wait, no: \\boxed{-3.5} and then 99", -3.5),
        ("no number here", None),
    ],
)
def test_parse_number(completion, expected):
    assert parse_number(completion) == expected


def test_score_compares_with_the_reference_after_hashes():
    reference = reference_answer("Janet sells 16 - 3 - 4 = 9 eggs... 9 * 2 = 18\n#### 18")
    assert reference == 18.0
    assert score("She makes \\boxed{18} dollars", reference) == 1.0
    assert score("She makes \\boxed{16} dollars, 18 total", reference) == 0.0
    assert score("I don't know", reference) == 0.0


def test_process_runs_offline_on_a_local_dataset(inference_server, tiny_model_path, tmp_path):
    problems = tmp_path / "gsm8k.jsonl"
    problems.write_text(
        "".join(
            json.dumps({"question": f"What is {a} + {a}?", "answer": f"{a}+{a}\n#### {2 * a}"})
            + "\n"
            for a in range(1, 4)
        )
    )
    out = tmp_path / "groups.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "environments" / "gsm8k_server.py"),
            "process",
            *("--env.dataset_path", str(problems), "--env.tokenizer_name", str(tiny_model_path)),
            *("--env.group_size", "2", "--env.total_steps", "2", "--env.max_tokens", "8"),
            *("--env.max_token_length", "256", "--env.use_wandb", "false"),
            *("--env.data_path_to_save_groups", str(out)),
            *("--openai.base_url", f"{inference_server.url}/v1", "--openai.model_name", "tiny"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 2
    assert all(len(g["tokens"]) == 2 and set(g["scores"]) <= {0.0, 1.0} for g in groups)
    assert "What is 1 + 1?" in json.dumps(groups[0]["messages"])
