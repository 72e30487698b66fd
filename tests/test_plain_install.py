"""A plain `pip install atroposlib` (no extras, no torch) writes, imports and runs a BaseEnv.

The package is built and installed into a fresh venv without system site
packages; an upstream-style environment then runs `process` against a real
OpenAI-compatible server (the CPU inference server, started from the test venv).
The install goes through uv where the test venv has it (scripts/install_venv.sh puts
it there), else pip: both build the wheel with the project's own backend and resolve
the same metadata against the same pins, and uv takes 6 s of CPU where pip took 38.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

ENV_SOURCE = """
import os

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer


class EchoEnv(BaseEnv):
    name = "echo"

    @classmethod
    def config_init(cls):
        config = BaseEnvConfig(
            tokenizer_name=os.environ["ECHO_TOKENIZER"], group_size=2, use_wandb=False,
            total_steps=2,
        )
        return config, [APIServerConfig(base_url=os.environ["ECHO_BASE_URL"], model_name="tiny")]

    async def setup(self):
        self.count = 0

    async def get_next_item(self):
        self.count += 1
        return {"question": f"say {self.count}"}

    async def collect_trajectories(self, item):
        chat = [{"role": "user", "content": item["question"]}]
        completion = await self.server.chat_completion(
            messages=chat, n=self.config.group_size, max_tokens=8
        )
        group = ScoredDataGroup(tokens=[], masks=[], scores=[])
        for index, choice in enumerate(completion.choices):
            turns = chat + [{"role": "assistant", "content": choice.message.content}]
            out = tokenize_for_trainer(self.tokenizer, turns)
            group["tokens"].append(out["tokens"])
            group["masks"].append(out["masks"])
            group["scores"].append(float(index))
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    EchoEnv.cli()
"""


@pytest.mark.e2e
def test_a_plain_install_imports_subclasses_and_runs_base_env(
    tmp_path, tiny_model_path, inference_server
):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    uv = Path(sys.executable).with_name("uv")
    installer = (
        [str(uv), "pip", "install", "-q", "--python", str(python)]
        if uv.exists()
        # --no-compile: byte-compiling every dependency costs CPU and proves nothing here
        else [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        + ["--no-compile"]
    )
    install = subprocess.run(
        [*installer, "-c", str(REPO / "scripts" / "constraints.txt"), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    probe = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('torch') is None)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "True", "torch leaked into a plain install"

    env_file = tmp_path / "echo_env.py"
    env_file.write_text(textwrap.dedent(ENV_SOURCE))
    out = tmp_path / "groups.jsonl"
    run = subprocess.run(
        [str(python), str(env_file), "process", "--env.data_path_to_save_groups", str(out)],
        env={
            "PATH": os.environ["PATH"],
            "HOME": os.environ.get("HOME", str(tmp_path)),
            "HF_HUB_OFFLINE": "1",
            "ECHO_TOKENIZER": str(tiny_model_path),
            "ECHO_BASE_URL": f"{inference_server.url}/v1",
        },
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 2, run.stderr[-3000:]
    for group in groups:
        assert group["scores"] == [0.0, 1.0]
        assert len(group["tokens"]) == 2 and all(group["tokens"])
        assert all(-100 in masks for masks in group["masks"]), "prompt tokens are not masked"
    assert out.with_suffix(".html").exists()
