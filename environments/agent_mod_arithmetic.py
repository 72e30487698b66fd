r"""A black-box agent trained through the ManagedServer proxy, on mod-10 arithmetic.

`DigitAgent` is an agent loop written only against the `openai` SDK, as agents in
the wild are: it asks the question and, when the reply holds no digit, asks once
more for one. It knows nothing of Atropos. Each rollout opens a session on the
proxy (`self.server.managed_server()`), hands the agent the session's base URL,
scores the agent's final answer and reads the session's recorded tokens, masks
and logprobs back: the agent's whole conversation is one trained sequence.

Why this task: the project's tiny model is pretrained on exactly this system line
and question wording (see `mod_arithmetic.py`), so the agent's first answers are
~30% right and GRPO through the proxy can raise that within minutes on a CPU.

Where the proxy comes from: `ATROPOS_PROXY_URL` (or `--env.proxy_url`) names a
running `atropos-proxy`; without one the environment serves the proxy itself, in
process, on a loopback port over its own inference servers (`create_app` in a
uvicorn server on its event loop), so `atropos-launch` needs nothing extra:

    atropos-launch configs/agent_proxy_cpu.yaml

or beside a trajectory API and a trainer:

    python environments/agent_mod_arithmetic.py serve \
        --env.rollout_server_url http://127.0.0.1:8000 \
        --openai.base_url http://127.0.0.1:9001/v1 --openai.model_name tiny

or offline, without a trainer (groups to jsonl plus an HTML viewer), on the tiny
model (environments/README.md builds and serves it):

    python environments/agent_mod_arithmetic.py process --env.total_steps 2 \
        --openai.base_url http://127.0.0.1:9001/v1 --openai.model_name tiny
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import Field

# `python environments/agent_mod_arithmetic.py` puts environments/ on sys.path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig
from atroposlib.utils.tiny_model import ensure_tiny_model
from atroposlib.utils.tiny_model_training import SYSTEM_PROMPT
from atroposlib.utils.tiny_model_training import question_text as question_for

DIGIT = re.compile(r"\d")


class DigitAgent:
    """An ordinary OpenAI-client agent: it gets a client, it returns an answer."""

    def __init__(
        self, client: Any, model: str, max_tokens: int = 4, temperature: float = 1.0
    ) -> None:
        self.client = client
        self.model = model
        self.max_tokens = max_tokens
        self.temperature = temperature

    async def solve(self, question: str) -> str:
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question},
        ]
        for _ in range(2):
            reply = await self.client.chat.completions.create(
                model=self.model,
                messages=messages,
                max_tokens=self.max_tokens,
                temperature=self.temperature,
            )
            text = reply.choices[0].message.content or ""
            if DIGIT.search(text):
                return text.strip()
            messages += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": "Answer with one digit."},
            ]
        return ""


class AgentModArithmeticConfig(BaseEnvConfig):
    seed: int = Field(0, description="Seed for the stream of problems.")
    max_tokens: int = Field(4, ge=1, description="Most completion tokens per agent turn.")
    eval_size: int = Field(
        20, ge=1, le=100, description="Problems the greedy evaluation asks the agent."
    )
    proxy_url: str | None = Field(
        None,
        description="A running atropos-proxy (default: $ATROPOS_PROXY_URL, else one served "
        "in process on a loopback port).",
    )


class AgentModArithmeticEnv(BaseEnv):
    """(a + b) mod 10, answered by `DigitAgent` through the proxy; 1.0 for the right digit."""

    name = "agent_mod_arithmetic"
    env_config_cls = AgentModArithmeticConfig
    config: AgentModArithmeticConfig

    @classmethod
    def config_init(cls) -> tuple[AgentModArithmeticConfig, APIServerConfig]:
        config = AgentModArithmeticConfig(
            tokenizer_name=str(ensure_tiny_model()),
            group_size=8,
            use_wandb=False,
            max_token_length=128,
            ensure_scores_are_not_same=False,  # as mod_arithmetic: score_mean stays honest
        )
        server = APIServerConfig(
            model_name="tiny", base_url="http://127.0.0.1:9001/v1", server_type="vllm"
        )
        return config, server

    async def setup(self) -> None:
        from atroposlib.utils.http_client import shared_async_http_client

        self.http = shared_async_http_client()
        self.rng = random.Random(self.config.seed)
        self._proxy_task: asyncio.Task | None = None
        if self.config.proxy_url:
            self.server.proxy_url = self.config.proxy_url
        if not self.server.proxy_url:
            self.server.proxy_url = await self._serve_proxy()
        self.server.use_proxy = True

    async def _serve_proxy(self) -> str:
        """The proxy in process, over this env's servers, on a free loopback port."""
        from atroposlib.envs.server_handling.managed_server_proxy import serve_in_process

        model = self.server.servers[0].config.model_name
        url, self._proxy_task = await serve_in_process(self.server, self.tokenizer, model)
        logging.getLogger("atroposlib.envs").info("serving the agent proxy at %s", url)
        return url

    async def get_next_item(self) -> dict[str, int]:
        return {"a": self.rng.randrange(10), "b": self.rng.randrange(10)}

    async def run_agent(self, item: dict[str, int], temperature: float) -> tuple[str, list]:
        """The agent's answer to `item`, and the nodes its proxy session recorded."""
        import openai

        async with self.server.managed_server() as managed:
            # the agent's own client, on the session's URL; the connection pool is shared
            # (building an SSL context per rollout cost more CPU than the rollout)
            client = openai.AsyncOpenAI(
                base_url=managed.get_url(), api_key=managed.api_key, http_client=self.http
            )
            agent = DigitAgent(client, "tiny", self.config.max_tokens, temperature)
            answer = await agent.solve(question_for(item["a"], item["b"]))
            nodes = (await managed.fetch_state())["nodes"]
        return answer, nodes

    async def collect_trajectory(self, item: dict[str, int]) -> tuple[dict | None, list]:
        answer, nodes = await self.run_agent(item, temperature=1.0)
        if not nodes:
            return None, []
        node = max(nodes, key=lambda n: len(n.tokens))  # the whole conversation
        return {
            "tokens": node.tokens,
            "masks": node.masked_tokens,
            "scores": score(answer, item),
            "inference_logprobs": node.logprobs,
        }, []

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """Greedy accuracy of the agent on a fixed sample of the 100 problems."""
        started = time.time()
        pairs = [(a, b) for a in range(10) for b in range(10)]
        chosen = random.Random(1234).sample(pairs, self.config.eval_size)
        items = [{"a": a, "b": b} for a, b in chosen]
        answers = await asyncio.gather(*(self.run_agent(item, 0.0) for item in items))
        samples = [
            {
                "question": question_for(item["a"], item["b"]),
                "answer": answer,
                "score": score(answer, item),
            }
            for item, (answer, _) in zip(items, answers, strict=True)
        ]
        accuracy = sum(s["score"] for s in samples) / len(samples)
        await self.evaluate_log(
            {"eval/accuracy": accuracy},
            samples=samples,
            start_time=started,
            end_time=time.time(),
            generation_parameters={"temperature": 0.0, "max_tokens": self.config.max_tokens},
        )


def score(answer: str, item: dict[str, int]) -> float:
    """1.0 when the agent's answer is exactly the right digit."""
    return 1.0 if answer == str((item["a"] + item["b"]) % 10) else 0.0


if __name__ == "__main__":
    AgentModArithmeticEnv.cli()
