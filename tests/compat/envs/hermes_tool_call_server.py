"""A hermes-style tool-calling environment in upstream Atropos's style.

The tools are described in the system prompt inside <tools></tools>, the model
answers with <tool_call>{...}</tool_call>, and each answer is parsed with
upstream's `atroposlib.utils.tool_call_parser.parse_tool_call` (validated against
the tool list) and compared with the expected call: 1.0 for the right call,
0.0 for the right tool with wrong arguments, -1.0 when nothing valid was called.
"""

# upstream's typing style (typing.List/Dict/Optional) is kept on purpose
# ruff: noqa: UP006, UP035, UP045

import json
import random
from typing import Dict, List, Optional, Tuple

from atroposlib.envs.base import (
    APIServerConfig,
    BaseEnv,
    BaseEnvConfig,
    ScoredDataGroup,
)
from atroposlib.type_definitions import Item
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer
from atroposlib.utils.tool_call_parser import parse_tool_call

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert_currency",
            "description": "Convert an amount between currencies.",
            "parameters": {
                "type": "object",
                "properties": {
                    "amount": {"type": "number"},
                    "source": {"type": "string"},
                    "target": {"type": "string"},
                },
                "required": ["amount", "source", "target"],
            },
        },
    },
]

TASKS = [
    {
        "question": "What's the weather in Paris, in celsius?",
        "expected": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
    },
    {
        "question": "How much is 12 EUR in USD?",
        "expected": {
            "name": "convert_currency",
            "arguments": {"amount": 12, "source": "EUR", "target": "USD"},
        },
    },
]


class HermesToolCallEnv(BaseEnv):
    name = "hermes_tool_calls"

    def __init__(
        self,
        config: BaseEnvConfig,
        server_configs: List[APIServerConfig],
        slurm=True,
        testing=False,
    ):
        super().__init__(config, server_configs, slurm, testing)
        self.percent_correct_buffer = list()
        self.system_prompt = (
            "You are a function calling AI model. You are provided with function signatures "
            f"within <tools></tools> XML tags.\n<tools>\n{json.dumps(TOOLS)}\n</tools>\n"
            "For each function call return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-dict>}\n</tool_call>'
        )

    @classmethod
    def config_init(cls) -> Tuple[BaseEnvConfig, List[APIServerConfig]]:
        env_config = BaseEnvConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
            group_size=3,
            use_wandb=False,
            rollout_server_url="http://localhost:8000",
            total_steps=2,
            batch_size=6,
            steps_per_eval=100,
            max_token_length=4096,
            wandb_name="hermes_tool_calls",
        )
        server_configs = [
            APIServerConfig(
                model_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
                base_url="http://localhost:9004/v1",
                api_key="x",
                num_requests_for_eval=8,
            ),
        ]
        return env_config, server_configs

    async def setup(self):
        self.iter = 0

    async def get_next_item(self) -> Item:
        task = TASKS[self.iter % len(TASKS)]
        self.iter += 1
        return (task["question"], json.dumps(task["expected"]))

    def _score_response(self, response: str, expected: Dict) -> float:
        tool_name, arguments, is_error = parse_tool_call(response, TOOLS, ["tool_call"])
        if is_error or tool_name != expected["name"]:
            return -1.0
        return 1.0 if arguments == expected["arguments"] else 0.0

    async def collect_trajectories(self, item) -> Tuple[Optional[ScoredDataGroup], List]:
        question, expected_json = item
        expected = json.loads(expected_json)
        prompt = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": question},
        ]
        chat_completions = await self.server.chat_completion(
            messages=prompt,
            n=self.config.group_size,
            max_tokens=256,
            temperature=0.8,
        )
        to_score = []
        for choice in chat_completions.choices:
            messages = prompt + [{"role": "assistant", "content": choice.message.content}]
            to_score.append((messages, expected, choice.finish_reason))
        return await self.score(to_score), []

    async def score(self, rollout_group_data) -> Optional[ScoredDataGroup]:
        scores = ScoredDataGroup()
        scores["tokens"] = list()
        scores["masks"] = list()
        scores["scores"] = list()
        scores["messages"] = list()
        random.shuffle(rollout_group_data)
        for messages, expected, finish_reason in rollout_group_data:
            reward = self._score_response(messages[-1]["content"], expected)
            out_dict = tokenize_for_trainer(self.tokenizer, messages, finish_reason=finish_reason)
            scores["tokens"].append(out_dict["tokens"])
            scores["masks"].append(out_dict["masks"])
            scores["scores"].append(reward)
            scores["messages"].append(messages)
        for score in scores["scores"]:
            self.percent_correct_buffer.append(max(score, 0))
        return scores

    async def evaluate(self, *args, **kwargs):
        correct = []
        for task in TASKS:
            completion = await self.server.chat_completion(
                messages=[
                    {"role": "system", "content": self.system_prompt},
                    {"role": "user", "content": task["question"]},
                ],
                n=1,
                max_tokens=256,
                temperature=0.0,
                split="eval",
            )
            response = completion.choices[0].message.content
            correct.append(self._score_response(response, task["expected"]) == 1.0)
        await self.evaluate_log(metrics={"eval/percent_correct": sum(correct) / len(correct)})

    async def wandb_log(self, wandb_metrics: Optional[Dict] = None):
        if wandb_metrics is None:
            wandb_metrics = {}
        if self.percent_correct_buffer:
            wandb_metrics["train/percent_correct"] = sum(self.percent_correct_buffer) / len(
                self.percent_correct_buffer
            )
        self.percent_correct_buffer = list()
        await super().wandb_log(wandb_metrics)


if __name__ == "__main__":
    HermesToolCallEnv.cli()
