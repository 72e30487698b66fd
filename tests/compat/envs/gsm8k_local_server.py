"""A GSM8K-style environment written as an upstream Atropos user writes one.

Modelled on upstream's environments/gsm8k_server.py: samples go through
`self.server.managed_server(tokenizer=self.tokenizer)` with
`chat_completion(n=group_size)`, and the tracked nodes give the tokens, masks
and inference logprobs. The dataset is a local jsonl (loaded with `datasets`,
as upstream loads its hub copy), named by extra config fields, so the run
needs no downloads. Only upstream's public names are used.
"""

# upstream's typing style (typing.List/Dict/Optional) is kept on purpose
# ruff: noqa: UP006, UP007, UP035, UP045

import random
import time
from typing import Dict, List, Optional, Tuple, TypedDict, Union

from datasets import load_dataset
from latex2sympy2_extended import NormalizationConfig
from math_verify import LatexExtractionConfig, parse, verify
from pydantic import Field
from tqdm.asyncio import tqdm_asyncio

from atroposlib.envs.base import (
    APIServerConfig,
    BaseEnv,
    BaseEnvConfig,
    ScoredDataGroup,
)
from atroposlib.type_definitions import Item

system_prompt = (
    "You are a careful math tutor. Think step by step, then give your final answer "
    "like this: \\boxed{your answer here}"
)


class GSM8kRow(TypedDict):
    question: str
    answer: str


class GSM8kLocalConfig(BaseEnvConfig):
    train_file: str = Field(default="gsm8k_train.jsonl", description="jsonl with question/answer")
    eval_file: str = Field(default="gsm8k_test.jsonl", description="jsonl with question/answer")
    max_answer_tokens: int = Field(default=16, description="max_tokens for each sample")
    eval_temperature: float = Field(default=0.0, description="temperature for evaluation")


class GSM8kLocalEnv(BaseEnv):
    name = "gsm8k_local"
    env_config_cls = GSM8kLocalConfig

    def __init__(
        self,
        config: GSM8kLocalConfig,
        server_configs: List[APIServerConfig],
        slurm=True,
        testing=False,
    ):
        super().__init__(config, server_configs, slurm, testing)
        self.percent_correct_buffer = list()
        self.eval_metrics = list()
        self.rollouts_for_wandb = []
        self.completion_lengths = []

    @classmethod
    def config_init(cls) -> Tuple[GSM8kLocalConfig, List[APIServerConfig]]:
        env_config = GSM8kLocalConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-3B-Preview",
            group_size=2,
            use_wandb=False,
            rollout_server_url="http://localhost:8000",
            total_steps=2,
            batch_size=4,
            steps_per_eval=100,
            max_token_length=512,
            wandb_name="gsm8k_local",
        )
        server_configs = [
            APIServerConfig(
                model_name="NousResearch/DeepHermes-3-Llama-3-3B-Preview",
                base_url="http://localhost:9001/v1",
                api_key="x",
                server_type="vllm",
                num_requests_for_eval=8,
            )
        ]
        return env_config, server_configs

    async def wandb_log(self, wandb_metrics: Optional[Dict] = None):
        if wandb_metrics is None:
            wandb_metrics = {}
        try:
            wandb_metrics["train/percent_correct"] = sum(self.percent_correct_buffer) / len(
                self.percent_correct_buffer
            )
        except ZeroDivisionError:
            pass
        self.percent_correct_buffer = list()
        for item in self.eval_metrics:
            wandb_metrics[item[0]] = item[1]
        self.eval_metrics = list()
        await super().wandb_log(wandb_metrics)

    async def setup(self):
        self.train = load_dataset("json", data_files=self.config.train_file, split="train")
        test_data = load_dataset("json", data_files=self.config.eval_file, split="train")
        self.test = list()
        for item in test_data:
            self.test.append(
                {
                    "question": item["question"],
                    "gold_answer": item["answer"].split("#")[-1].strip().replace(",", ""),
                }
            )
        self.iter = 0

    def save_checkpoint(self, step, data=None):
        if data is None:
            data = {}
        data["iter"] = self.iter
        super().save_checkpoint(step, data)

    async def rollout_and_score_eval(self, question: str, answer: str) -> dict:
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(
                messages=[
                    {"role": "system", "content": system_prompt},
                    {"role": "user", "content": question},
                ],
                n=1,
                max_tokens=self.config.max_answer_tokens,
                temperature=self.config.eval_temperature,
                split="eval",
            )
            response_content = completion.choices[0].message.content

        gold_parsed = parse(
            "\\boxed{" + answer + "}",
            extraction_mode="first_match",
            extraction_config=[LatexExtractionConfig()],
        )
        answer_parsed = self._parse_answer(response_content)
        score = 1 if verify(answer_parsed, gold_parsed) else 0
        sample = {
            "messages": [
                {"role": "system", "content": system_prompt},
                {"role": "user", "content": question},
                {"role": "assistant", "content": response_content},
            ],
            "question": question,
            "gold_answer": answer,
            "score": int(score),
            "correct": bool(score),
            "finish_reason": completion.choices[0].finish_reason,
        }
        return {"score": score, "sample": sample}

    async def evaluate(self, *args, **kwargs):
        start_time = time.time()
        eval_tasks = []
        for item in self.test:
            eval_tasks.append(self.rollout_and_score_eval(item["question"], item["gold_answer"]))
        results = await tqdm_asyncio.gather(*eval_tasks)

        scores = [result["score"] for result in results]
        samples = [result["sample"] for result in results]
        percent_correct = sum(scores) / len(scores)
        end_time = time.time()

        self.eval_metrics.append(("eval/percent_correct", percent_correct))
        eval_metrics = {
            "eval/percent_correct": percent_correct,
            "eval/num_samples": len(scores),
        }
        await self.evaluate_log(
            metrics=eval_metrics,
            samples=samples,
            start_time=start_time,
            end_time=end_time,
            generation_parameters={
                "temperature": self.config.eval_temperature,
                "max_tokens": self.config.max_answer_tokens,
            },
        )

    def _parse_answer(self, text: str):
        return parse(
            text.split("</think>")[-1],
            extraction_config=[
                LatexExtractionConfig(
                    normalization_config=NormalizationConfig(
                        nits=False,
                        malformed_operators=False,
                        basic_latex=True,
                        equations=True,
                        boxed="all",
                        units=True,
                    ),
                    boxed_match_priority=0,
                    try_extract_without_anchor=False,
                )
            ],
            extraction_mode="first_match",
        )

    async def collect_trajectories(self, item: GSM8kRow) -> Tuple[ScoredDataGroup, list[Item]]:
        user_message = {"role": "user", "content": item["question"]}
        gold_answer = "\\boxed{" + item["answer"].split("#")[-1].strip().replace(",", "") + "}"

        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            chat_completions = await managed.chat_completion(
                messages=[{"role": "system", "content": system_prompt}, user_message],
                n=self.config.group_size,
                max_tokens=self.config.max_answer_tokens,
                temperature=1.0,
            )
            state = managed.get_state()
            nodes = state["nodes"]

        to_score = list()
        to_backlog = list()
        for i, chat_completion in enumerate(chat_completions.choices):
            messages = (
                {"role": "system", "content": system_prompt},
                user_message,
                {"role": "assistant", "content": chat_completion.message.content},
            )
            to_score.append(
                {
                    "messages": messages,
                    "gold_answer": gold_answer,
                    "finish_reason": chat_completion.finish_reason,
                    "tokens": nodes[i].tokens,
                    "masks": nodes[i].masked_tokens,
                    "logprobs": nodes[i].logprobs,
                }
            )
        to_postprocess = await self.score(to_score)
        return to_postprocess, to_backlog

    async def score(
        self, rollout_group_data
    ) -> Union[Optional[ScoredDataGroup], List[Optional[ScoredDataGroup]]]:
        scores = ScoredDataGroup()
        scores["tokens"] = list()
        scores["masks"] = list()
        scores["scores"] = list()
        scores["inference_logprobs"] = list()
        scores["messages"] = list()
        gold_parsed = parse(
            rollout_group_data[0]["gold_answer"],
            extraction_mode="first_match",
            extraction_config=[LatexExtractionConfig()],
        )
        if len(gold_parsed) == 0:
            return None
        random.shuffle(rollout_group_data)
        for item in rollout_group_data:
            answer_parsed = self._parse_answer(item["messages"][-1]["content"])
            reward = verify(answer_parsed, gold_parsed)
            scores["tokens"].append(item["tokens"])
            scores["masks"].append(item["masks"])
            scores["inference_logprobs"].append(item["logprobs"])
            scores["messages"].append(list(item["messages"]))
            scores["scores"].append(1.0 if reward else -1.0)
            if len(scores["tokens"]) >= self.config.group_size:
                break
        for score in scores["scores"]:
            self.percent_correct_buffer.append(max(score, 0))
        return scores

    async def get_next_item(self) -> GSM8kRow:
        next_item = self.train[self.iter % len(self.train)]
        self.iter += 1
        return next_item


if __name__ == "__main__":
    GSM8kLocalEnv.cli()
