"""`BaseEnvConfig`: every knob of an environment, one pydantic model (Atropos's fields)."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, Field


class EvalHandlingEnum(str, Enum):
    """What training does while an evaluation runs."""

    STOP_TRAIN = "STOP_TRAIN"  # no new rollouts until the evaluation is done
    LIMIT_TRAIN = "LIMIT_TRAIN"  # rollouts continue with eval_limit_ratio of the workers
    NONE = "NONE"  # evaluation runs beside full-speed rollouts


class BaseEnvConfig(BaseModel):
    group_size: int = Field(4, ge=1, description="Rollouts per item (one scored group).")
    max_num_workers: int = Field(
        -1, description="Concurrent rollout workers; -1 = max_num_workers_per_node x servers."
    )
    max_eval_workers: int = Field(16, description="Concurrent evaluation workers.")
    max_num_workers_per_node: int = Field(8, description="Workers per inference server.")
    steps_per_eval: int = Field(100, description="Run evaluate() every this many trainer steps.")
    eval_step: int | None = Field(
        None,
        ge=0,
        description="evaluate: the trainer step the evaluated weights stand for; the result "
        "then joins history.jsonl at that step (atropos-launch's evaluation of the final "
        "checkpoint).",
    )
    eval_at_start: bool = Field(
        False,
        description="serve: evaluate once before the first step too, when total_steps reaches "
        "steps_per_eval, so the eval curve has a baseline (atropos-launch turns it on).",
    )
    max_token_length: int = Field(2048, description="Longest sequence this env produces.")
    eval_handling: EvalHandlingEnum = Field(
        EvalHandlingEnum.STOP_TRAIN, description="STOP_TRAIN, LIMIT_TRAIN or NONE."
    )
    eval_limit_ratio: float = Field(
        0.5, description="Share of workers kept during evaluation with LIMIT_TRAIN."
    )
    inference_weight: float = Field(1.0, description="Relative share of batches for this env.")
    batch_size: int = Field(-1, description="Trainer batch size; -1 = ask the API.")
    max_batches_offpolicy: int = Field(
        3, description="Most batches of this env's work queued or in flight at once."
    )
    tokenizer_name: str = Field(
        "NousResearch/DeepHermes-3-Llama-3-3B-Preview",
        description="Tokenizer (hub name or local directory).",
    )
    use_wandb: bool = Field(True, description="Log to Weights & Biases (offline without a key).")
    rollout_server_url: str = Field("http://localhost:8000", description="Trajectory API URL.")
    api_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Seconds a call to the trajectory API may take before it is retried "
        "(ours; a stalled or restarting API is waited out, and a retried post is not queued "
        "twice).",
    )
    total_steps: int = Field(
        1000,
        description="Stop after the trainer reaches this step; -1 = the trainer's num_steps "
        "(process: groups to write).",
    )
    wandb_name: str | None = Field(None, description="Run name (serve: the env class's name).")
    num_rollouts_to_keep: int = Field(32, description="Rollouts kept for the wandb table.")
    num_rollouts_per_group_for_logging: int = Field(
        1, description="Rollouts per group shown in the wandb table (-1 = all)."
    )
    ensure_scores_are_not_same: bool = Field(
        True, description="Drop groups whose scores are all equal (no learning signal)."
    )
    data_path_to_save_scores: str | None = Field(
        None,
        description="serve: one JSON line per scored group, kept or dropped (the trainer step, "
        "its scores, why it was dropped), so a run is judged on every group it scored "
        "(atropos-launch sets it).",
    )
    data_path_to_save_groups: str | None = Field(
        None, description="Also write groups to this jsonl."
    )
    data_dir_to_save_evals: str | None = Field(None, description="Where evaluate_log writes.")
    min_items_sent_before_logging: int = Field(2, description="Groups sent before a wandb log.")
    include_messages: bool = Field(False, description="Send decoded messages with each group.")
    min_batch_allocation: float | None = Field(
        None, ge=0.0, le=1.0, description="Share of every batch reserved for this env."
    )
    stop_when_refused_s: float = Field(
        60.0,
        ge=0,
        description="serve stops (exit 2, with the refusal's line) once every rollout for this "
        "long, 16 at least, was refused for the model's context and none fitted; 0: never.",
    )
    worker_timeout: float = Field(
        600, description="Seconds before a rollout worker is abandoned; 0 or -1 = no timeout."
    )
    thinking_mode: bool = Field(
        False,
        description="Send reasoning settings with chat requests (on by itself when "
        "reasoning_effort or max_reasoning_tokens is set).",
    )
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = Field(
        None, description="Reasoning effort for servers that support it."
    )
    max_reasoning_tokens: int | None = Field(
        None, ge=1024, le=32000, description="Reasoning token budget."
    )
    custom_thinking_prompt: str | None = Field(
        None,
        description="System prompt for thinking; for envs that read it (BaseEnv does not add it).",
    )
