"""The data tools as real subprocesses, groups posted as an env would, a finished run's
directory as an env leaves it, and TRL's preparation."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.groups import register_env
from tests.support.json_http import JsonHandler, LocalHttpServer
from tests.support.waiting import wait_until

MODULES = {"sft": "atroposlib.cli.sft", "dpo": "atroposlib.cli.dpo"}


class DataTool:
    """`python -m atroposlib.cli.{sft,dpo} ARGS...` with its output captured to a log file."""

    def __init__(self, kind: str, log_dir: Path, *args: str, env: dict | None = None) -> None:
        self.log_path = log_dir / f"{kind}-{time.monotonic_ns()}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", MODULES[kind], *args],
            stdout=open(self.log_path, "wb"),
            stderr=subprocess.STDOUT,
            env=env,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout_s: float = 120) -> int:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"the tool did not finish: {self.log()[-2000:]}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(15)


def registered(client: httpx.Client, batch_size: int, timeout_s: float = 120) -> None:
    """Wait until a trainer registered with the API for batches of `batch_size`."""
    wait_until(
        lambda: client.get("/info").json().get("batch_size") == batch_size,
        timeout_s,
        f"no trainer registered for batches of {batch_size}",
        poll_s=0.2,
    )


def post_groups(client: httpx.Client, groups: list[dict[str, Any]], timeout_s: float = 120) -> None:
    """Post groups as a registered env would, once the trainer (the tool) has started."""
    size = len(groups[0]["tokens"])
    env_id = wait_until(
        lambda: _registered_env(client, size),
        timeout_s,
        "the trainer did not start (no /batch call yet)",
        poll_s=0.2,
    )
    env_id = env_id["env_id"]
    response = client.post("/scored_data_list", json=[{**g, "env_id": env_id} for g in groups])
    assert response.status_code == 200, response.text


def _registered_env(client: httpx.Client, group_size: int) -> dict[str, Any] | None:
    answer = register_env(client, group_size=group_size)
    return answer if "env_id" in answer else None


SYSTEM = {"role": "system", "content": "Answer with one digit."}


def chat_group(
    tokenizer: Any, question: str, answers: list[str], scores: list[float], group_id: str
) -> dict[str, Any]:
    """A group as an environment sends and records it (include_messages, as atropos-launch
    sets): the chat template's tokens with the prompt masked, each conversation, the ids."""
    from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

    chats = [
        [SYSTEM, {"role": "user", "content": question}, {"role": "assistant", "content": a}]
        for a in answers
    ]
    tokenized = [tokenize_for_trainer(tokenizer, chat) for chat in chats]
    return {
        "tokens": [t["tokens"] for t in tokenized],
        "masks": [t["masks"] for t in tokenized],
        "scores": scores,
        "messages": chats,
        "group_id": group_id,
        "env_id": 0,
    }


def finished_run(
    run_dir: Path, rollouts: dict[str, list[Any]], model: str | None = "tiny", tail: str = ""
) -> Path:
    """A run directory as atropos-launch leaves it, as far as the data tools read it:
    config.yaml naming the model, and rollouts/<env>.jsonl with one JSON line per group
    (atroposlib.envs.sending.append_lines' format); `tail` ends every file (a cut line)."""
    (run_dir / "rollouts").mkdir(parents=True, exist_ok=True)
    config = {"model": model} if model is not None else {"seed": 0}
    (run_dir / "config.yaml").write_text(json.dumps(config) + "\n")  # JSON is YAML
    for env, groups in rollouts.items():
        lines = "".join(json.dumps(group) + "\n" for group in groups)
        (run_dir / "rollouts" / f"{env}.jsonl").write_text(lines + tail)
    return run_dir


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    text = path.read_text()
    assert text == "" or text.endswith("\n"), "the file ends in a half line"
    return [json.loads(line) for line in text.splitlines()]


def trl_sft_dataset(path: Path, model_path: Any, out_dir: Path) -> Any:
    """The file through `datasets.load_dataset` and SFTTrainer's own dataset preparation."""
    from datasets import load_dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    dataset = load_dataset("json", data_files=str(path), split="train")
    trainer = SFTTrainer(
        model=str(model_path),
        args=SFTConfig(output_dir=str(out_dir), report_to="none", max_steps=1, use_cpu=True),
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(str(model_path)),
    )
    return trainer.train_dataset


def trained_text(tokenizer: Any, row: dict[str, Any]) -> str:
    """The tokens of a row TRL prepared that its loss is computed on, decoded."""
    labels = zip(row["input_ids"], row["labels"], strict=True)
    return tokenizer.decode([token for token, label in labels if label != -100])


def trl_dpo_dataset(path: Path, model_path: Any, out_dir: Path) -> Any:
    """The file through `datasets.load_dataset` and DPOTrainer's own dataset preparation."""
    from datasets import load_dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    dataset = load_dataset("json", data_files=str(path), split="train")
    trainer = DPOTrainer(
        model=str(model_path),
        args=DPOConfig(output_dir=str(out_dir), report_to="none", max_steps=1, use_cpu=True),
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(str(model_path)),
    )
    return trainer.train_dataset


class _CannedHandler(JsonHandler):
    def do_GET(self) -> None:
        answer = self.owner.answers.get(self.path)
        if isinstance(answer, bytes):
            self.send_response(200)
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
        else:
            self._answer(200 if answer is not None else 404, answer)


class CannedApi(LocalHttpServer):
    """A server that is not run-api: answers GET paths with fixed JSON (or raw bytes)."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        super().__init__(_CannedHandler)
