"""`TrainingConfig`: every flag of `atropos-grpo`, documented (one pydantic model)."""

from __future__ import annotations

import argparse
import re
import shlex
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from atroposlib.utils.exposure import engine_args_problem
from atroposlib.utils.flags import add_model_flags
from example_trainer.losses import LOSSES, LossType, load_loss, loss_kind

WeightBridgeMode = Literal[
    "none", "restart", "hot_reload", "lora_only", "lora_restart", "shared_vllm"
]
LORA_MODES = ("lora_only", "lora_restart")
RESTART_MODES = ("none", "restart", "lora_restart")
HOT_MODE_CHECKPOINT_INTERVAL = 10
"""Steps between checkpoints in a hot mode by default: what a trainer crash re-trains."""


class TrainingConfig(BaseModel):
    model_name: str = Field(..., description="Policy to train: hub name or local directory.")
    lr: float = Field(1e-5, gt=0, description="Peak learning rate.")
    training_steps: int = Field(10, ge=1, description="Optimizer steps (one batch each).")
    batch_size: int = Field(16, ge=1, description="Sequences per step (registered with the API).")
    seq_len: int = Field(2048, ge=8, description="Longest sequence trained on (max_token_len).")
    gradient_accumulation_steps: int = Field(
        1, ge=1, description="Micro-batches per step (sequences are packed by length)."
    )
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="Cut micro-batches by size instead of count: length-sorted sequences, "
        "each micro-batch at most this many tokens: rows x longest row when padded, the sum "
        "of its lengths when packed (--padding-free).",
    )
    padding_free: Literal["auto", "on", "off"] = Field(
        "auto",
        description="With --micro-batch-tokens: pack each micro-batch's sequences end to end "
        "in one row, with no padding (on), or pad its rows (off). auto packs under a varlen "
        "attention kernel (flash_attention_*), where each sequence still attends only "
        "within itself; sdpa and eager would compute attention over the whole packed row. "
        "A model that attends across packed sequences is padded whatever this says "
        "(checked once at start).",
    )
    logprob_chunk_tokens: int = Field(
        0,
        ge=0,
        description="Compute token logprobs this many positions at a time from the last "
        "hidden state, recomputing each chunk's logits in backward, so a step never holds "
        "a micro-batch's float32 logits (0: the whole micro-batch at once).",
    )
    shared_prompt_forward: bool = Field(
        False,
        description="Run each distinct prompt of a padded micro-batch once and its samples' "
        "completions on its KV cache, instead of every sample's whole sequence: the same "
        "gradients for a fraction of the work when prompts are long and completions short "
        "(example_trainer/shared_prefix.py). Not with packing, --logprob-chunk-tokens, "
        "--entropy-coef or --gradient-checkpointing, which run rows whole.",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer in backward instead of keeping its "
        "activations: less memory for about a third more step time.",
    )
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps.")
    optimizer: Literal["adamw", "adamw_8bit", "adafactor"] = Field(
        "adamw", description="adamw, adamw_8bit (bitsandbytes) or adafactor (transformers)."
    )
    clip_eps: float = Field(
        0.2, gt=0, description="PPO clip range below 1 (and above, unless set)."
    )
    clip_eps_high: float | None = Field(
        None,
        gt=0,
        description="Clip range above 1 (asymmetric); with --loss-type cispo, the IS "
        "weight's absolute cap (default 5).",
    )
    loss_type: LossType = Field(
        "dapo",
        description="Policy loss, as TRL's loss_type: dapo (clipped ratio, averaged over all "
        "trained tokens of the batch), grpo (each sequence's mean, averaged over sequences), "
        "dr_grpo (summed, divided by sequences x --seq-len; no std scaling by default), cispo "
        "(a clipped, stop-gradient IS weight on the log-likelihood, capped at --clip-eps-high, "
        "default 5). See docs/trainer.md, The loss. "
        f"Registered: {', '.join(sorted(LOSSES))}.",
    )
    loss_import_path: str | None = Field(
        None,
        description="A loss of your own instead of --loss-type: module:function, a "
        "function of example_trainer.losses.LossInputs returning LossOutputs (registered "
        "with @register_loss for a normaliser other than per token). See docs/trainer.md, "
        "Adding a loss.",
    )
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token",
        description="The ratio per token, or per sequence as exp of the mean token log-ratio "
        "(GSPO; TRL's importance_sampling_level).",
    )
    advantage_estimator: Literal["grpo", "rloo"] = Field(
        "grpo",
        description="Baseline of each score: the group mean (grpo) or the mean of the group's "
        "other scores (rloo, leave-one-out).",
    )
    scale_advantages: Literal["group", "none"] | None = Field(
        None,
        description="Divide the centred scores by the group std (group) or not (none). "
        "Default: none for dr_grpo and rloo (as their papers and TRL), group otherwise.",
    )
    entropy_coef: float = Field(
        0.0,
        ge=0,
        description="Entropy bonus: subtract this times the mean per-token entropy of the "
        "trained tokens (TRL's entropy_coef).",
    )
    kl_coef: float = Field(0.0, ge=0, description="Weight of the k3 KL penalty to the reference.")
    kl_reference: Literal["env", "model"] = Field(
        "env",
        description="Where the KL's reference logprobs come from: the environments' "
        "ref_logprobs (env), or the trainer computes them (model): the base model under LoRA, "
        "else a frozen copy of --model-name.",
    )
    loss_normalization: Literal["token", "sequence"] | None = Field(
        None,
        description="Earlier spelling of --loss-type: token is dapo, sequence is grpo.",
    )
    ratio_reference: Literal["inference", "trainer"] | None = Field(
        None,
        description="The PPO ratio's denominator: the rollout's inference_logprobs (inference, "
        "upstream's) or the trainer's own logprobs before the update (trainer, TRL's and "
        "verl's). Default: trainer with --vllm-importance-sampling-correction, else inference.",
    )
    vllm_importance_sampling_correction: bool = Field(
        False,
        description="Weight each token's loss by the trainer's (before the update) over the "
        "rollout's probability of the sampled tokens, bounded by the mode (TRL's flag).",
    )
    vllm_importance_sampling_mode: Literal[
        "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"
    ] = Field(
        "sequence_mask",
        description="token_* weigh each token, sequence_* each sequence by exp of its summed "
        "log-ratio; *_truncate clamps the weight to [clip-min, clip-max], *_mask zeroes it "
        "outside (TRL's modes and default).",
    )
    vllm_importance_sampling_clip_max: float | None = Field(
        3.0, gt=0, description="Upper bound of the IS weight (TRL's C_max)."
    )
    vllm_importance_sampling_clip_min: float | None = Field(
        None, ge=0, description="Lower bound of the IS weight (TRL's C_min; none by default)."
    )
    max_staleness: int | None = Field(
        None,
        ge=0,
        description="Train no sequence sampled more than K versions before the step that "
        "trains it: such sequences are dropped and counted (stale_sequences_dropped), and "
        "environments start no rollout that would arrive staler (docs/trainer.md, "
        "Off-policy control). Default: no bound, as upstream.",
    )
    no_reference_logprobs: bool = Field(
        False,
        description="Upstream's flag: the rollout's inference_logprobs are not the ratio's "
        "denominator. Here that is --ratio-reference trainer (ratio 1: a REINFORCE-style "
        "step, as upstream described it).",
    )
    require_inference_logprobs: bool = Field(
        False,
        description="Refuse groups without inference_logprobs, as upstream does "
        "(default: train them with ratio 1 and warn).",
    )
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    device: str = Field("auto", description="cpu, cuda, cuda:N, or auto.")
    parallelism: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="Under torchrun: ddp (each rank holds the whole model, its gradients and "
        "optimizer state) or fsdp (FSDP2: all three sharded across ranks, per decoder layer).",
    )
    fsdp_cpu_offload: bool = Field(
        False,
        description="fsdp: keep parameter shards, gradients and optimizer state in CPU memory, "
        "moving each layer to the device only while it computes.",
    )
    save_path: str = Field("trained_model_checkpoints", description="Where checkpoints go.")
    save_checkpoint_interval: int | None = Field(
        None,
        ge=0,
        description="Write a resumable checkpoint every N steps (0: only those a restart "
        "mode needs, and the last). Independent of weight syncs. Default: every "
        f"{HOT_MODE_CHECKPOINT_INTERVAL} steps in the hot modes, whose syncs write no "
        "checkpoint, so a crash re-trains at most that many steps; 0 in the restart modes, "
        "whose engine restarts checkpoint already.",
    )
    checkpoint_interval: int | None = Field(
        None, ge=0, description="Upstream's spelling of --save-checkpoint-interval."
    )
    keep_checkpoints: int = Field(
        0,
        ge=0,
        description="Keep only the N newest checkpoints, plus the one the engine serves (0: all).",
    )
    vllm_restart_interval: int = Field(
        3,
        ge=1,
        description="Restart modes (none, restart, lora_restart): checkpoint and restart the "
        "inference engine every N steps.",
    )
    weight_sync_interval: int = Field(
        1,
        ge=1,
        description="Hot modes (hot_reload, lora_only, shared_vllm): push the weights to the "
        "running engine every N steps.",
    )
    weight_sync_timeout_s: float = Field(
        120.0, gt=0, description="Seconds a weight push may take before it counts as failed."
    )
    vllm_port: int = Field(
        9001, description="Port of the inference engine (the first, with --num-engines)."
    )
    num_engines: int = Field(
        1,
        ge=1,
        le=64,
        description="Inference engines to start and keep in sync, on ports --vllm-port, "
        "--vllm-port + 1, ...: each new version is pushed to all of them at once, and one "
        "that dies or fails a push is restarted while the others serve on.",
    )
    engine_device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda(:\d+)?)(,(cpu|cuda(:\d+)?))*$",
        description="Where the engines run: cpu, cuda or cuda:N, or a comma-separated list "
        "taken in turn by --num-engines engines (auto: the CPU engine on cpu, vLLM on the "
        "GPU it finds).",
    )
    vllm_gpu_memory_utilization: float = Field(0.45, description="vLLM's GPU memory share.")
    gpu_memory_utilization: float | None = Field(
        None, description="Upstream's spelling of --vllm-gpu-memory-utilization."
    )
    served_model_name: str | None = Field(
        None, description="Name environments use for the policy (default: --model-name)."
    )
    max_model_len: int | None = Field(None, description="Engine context length (default: seq_len).")
    dtype: str = Field("float32", description="Training and engine dtype: float32 or bfloat16.")
    inference_engine: Literal["vllm", "transformers", "auto", "none"] = Field(
        "auto", description="Engine to run: vllm, transformers (CPU), auto, or none (external)."
    )
    inference_python: str | None = Field(
        None, description="Python that runs the engine (e.g. a vLLM venv; default: this one)."
    )
    engine_args: str = Field("", description="Extra engine flags, space separated.")
    num_threads: int | None = Field(
        None, ge=1, description="torch threads (trainer and CPU engine)."
    )
    use_wandb: bool = Field(False, description="Log to Weights & Biases (offline without a key).")
    wandb_project: str = Field("atropos-grpo", description="wandb project.")
    wandb_group: str = Field("grpo", description="wandb group (also sent to the API).")
    weight_bridge_mode: WeightBridgeMode = Field(
        "none",
        description="How new weights reach the engine: none or restart (checkpoint + engine "
        "restart), hot_reload (full weights into the running engine), lora_only (LoRA "
        "adapters into the running engine), lora_restart (LoRA, merged, restart), "
        "shared_vllm (one copy of the weights shared with vLLM through CUDA IPC). "
        "See docs/trainer.md.",
    )
    lora_r: int = Field(16, description="LoRA rank.")
    lora_alpha: int = Field(32, description="LoRA alpha.")
    lora_dropout: float = Field(
        0.05, description="LoRA dropout (in effect only with --disable-dropout false)."
    )
    disable_dropout: bool = Field(
        True,
        description="Turn every dropout of the policy off, LoRA's included, as TRL's "
        "disable_dropout: the PPO ratio, the importance weights and --shared-prompt-forward "
        "assume each forward is the same function; dropout's noise would be clipped as if "
        "it were the policy's change.",
    )
    lora_target_modules: str = Field(
        "q_proj,v_proj",
        description="Module names LoRA adapts: comma-separated, or space-separated as "
        "upstream's (--lora-target-modules q_proj v_proj).",
    )
    atropos_url: str = Field("http://localhost:8000", description="Trajectory API URL.")
    api_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Seconds a call to the API may take before it is abandoned and asked again "
        "(a stalled API is waited out, never fatal).",
    )
    resume: str | None = Field(None, description="Checkpoint directory to continue from.")
    seed: int = Field(0, description="Random seed.")
    log_format: Literal["auto", "rich", "text", "json"] = Field(
        "auto", description="Console logs: rich on a terminal (auto), rich, text or json."
    )
    batch_wait_s: float = Field(
        2.0,
        ge=0,
        description="Seconds the API may hold an empty /batch open until a batch is ready "
        "(Prefer: wait; ours honours it, upstream's answers at once); 0: plain polling.",
    )
    batch_poll_s: float = Field(
        0.5,
        gt=0,
        description="Longest back-off between /batch polls, for an API that does not hold "
        "/batch open (ours does: Prefer: wait).",
    )

    @field_validator("lora_target_modules", mode="before")
    @classmethod
    def _module_list(cls, value: Any) -> Any:
        """Upstream's space-separated list (a list from the parser) or ours, comma-separated."""
        parts = value if isinstance(value, list) else [value] if isinstance(value, str) else None
        if parts is None:
            return value
        names = [name for part in parts for name in re.split(r"[,\s]+", str(part)) if name]
        if not names:
            raise ValueError("name at least one module, e.g. q_proj,v_proj")
        return ",".join(names)

    @field_validator("engine_args")
    @classmethod
    def _engine_args_keep_loopback(cls, value: str) -> str:
        problem = engine_args_problem(shlex.split(value))
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _one_way_to_cut_micro_batches(self) -> TrainingConfig:
        if self.micro_batch_tokens is not None and self.gradient_accumulation_steps != 1:
            raise ValueError(
                "--micro-batch-tokens and --gradient-accumulation-steps both decide the "
                "micro-batches; give one"
            )
        return self

    @model_validator(mode="after")
    def _loss_choice(self) -> TrainingConfig:
        """Resolve the defaults that depend on the loss, and refuse what contradicts it."""
        if self.no_reference_logprobs:
            if self.ratio_reference == "inference":
                raise ValueError(
                    "--no-reference-logprobs is --ratio-reference trainer, but --ratio-reference "
                    "inference was given; give one"
                )
            self.ratio_reference = "trainer"
            self.no_reference_logprobs = False
        if self.loss_normalization is not None:
            implied = "dapo" if self.loss_normalization == "token" else "grpo"
            if "loss_type" in self.model_fields_set and self.loss_type != implied:
                raise ValueError(
                    f"--loss-normalization {self.loss_normalization} is --loss-type {implied}, "
                    f"but --loss-type {self.loss_type} was given; give one"
                )
            self.loss_type = implied
            self.loss_normalization = None
        if self.loss_import_path is not None:
            if "loss_type" in self.model_fields_set and self.loss_type != self.loss_import_path:
                raise ValueError("--loss-import-path and --loss-type both name the loss; give one")
            self.loss_type = load_loss(self.loss_import_path).name
        kind = loss_kind(self.loss_type)
        if self.scale_advantages is None:
            plain = kind.scale_advantages == "none" or self.advantage_estimator == "rloo"
            self.scale_advantages = "none" if plain else "group"
        if self.clip_eps_high is None:
            self.clip_eps_high = kind.default_clip_eps_high
        elif kind.clip_eps_high_is_cap and self.clip_eps_high < 1:
            raise ValueError(
                f"--loss-type {kind.name} caps the IS weight at --clip-eps-high itself (as "
                f"TRL's epsilon_high), so {self.clip_eps_high} would shrink every token's "
                "gradient; give a cap of at least 1"
                + (f" (default {kind.default_clip_eps_high})" if kind.default_clip_eps_high else "")
            )
        correcting = self.vllm_importance_sampling_correction
        if self.ratio_reference is None:
            self.ratio_reference = "trainer" if correcting else "inference"
        elif correcting and self.ratio_reference == "inference":
            raise ValueError(
                "--vllm-importance-sampling-correction already weighs each token by the "
                "trainer's over the rollout's probability; a PPO ratio against the rollout "
                "(--ratio-reference inference) would count that gap twice. Use "
                "--ratio-reference trainer"
            )
        low, high = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        if low is not None and high is not None and low >= high:
            raise ValueError(
                f"--vllm-importance-sampling-clip-min ({low}) must be below "
                f"--vllm-importance-sampling-clip-max ({high})"
            )
        truncating = self.vllm_importance_sampling_mode.endswith("truncate")
        if correcting and truncating and low is None and high is None:
            raise ValueError(
                f"--vllm-importance-sampling-mode {self.vllm_importance_sampling_mode} needs "
                "--vllm-importance-sampling-clip-min or --vllm-importance-sampling-clip-max"
            )
        if self.kl_reference == "model" and self.kl_coef == 0:
            raise ValueError("--kl-reference model computes a reference for a KL: set --kl-coef")
        return self

    @model_validator(mode="after")
    def _fsdp_modes(self) -> TrainingConfig:
        if self.fsdp_cpu_offload and self.parallelism != "fsdp":
            raise ValueError("--fsdp-cpu-offload needs --parallelism fsdp")
        return self

    @model_validator(mode="after")
    def _engines(self) -> TrainingConfig:
        if self.num_engines > 1 and self.weight_bridge_mode == "shared_vllm":
            raise ValueError(
                "--weight-bridge-mode shared_vllm shares one copy of the weights with one "
                "vLLM; with --num-engines above 1 use hot_reload"
            )
        return self

    def engine_device_of(self, index: int) -> str:
        """The device of engine `index` (0-based) from --engine-device."""
        devices = self.engine_device.split(",")
        return devices[index % len(devices)]

    @model_validator(mode="after")
    def _one_memory_share(self) -> TrainingConfig:
        """Upstream's --gpu-memory-utilization is --vllm-gpu-memory-utilization."""
        if self.gpu_memory_utilization is not None:
            ours = self.vllm_gpu_memory_utilization
            if "vllm_gpu_memory_utilization" in self.model_fields_set and (
                ours != self.gpu_memory_utilization
            ):
                raise ValueError(
                    "--gpu-memory-utilization and --vllm-gpu-memory-utilization disagree; give one"
                )
            self.vllm_gpu_memory_utilization = self.gpu_memory_utilization
            self.gpu_memory_utilization = None
        return self

    @model_validator(mode="after")
    def _one_checkpoint_interval(self) -> TrainingConfig:
        """Upstream's --checkpoint-interval is --save-checkpoint-interval by another name."""
        if self.checkpoint_interval is not None:
            if self.save_checkpoint_interval and (
                self.save_checkpoint_interval != self.checkpoint_interval
            ):
                raise ValueError(
                    "--checkpoint-interval and --save-checkpoint-interval disagree; give one"
                )
            self.save_checkpoint_interval = self.checkpoint_interval
            self.checkpoint_interval = None
        if self.save_checkpoint_interval is None:
            hot = not self.restarts_engine
            self.save_checkpoint_interval = HOT_MODE_CHECKPOINT_INTERVAL if hot else 0
        return self

    @property
    def restarts_engine(self) -> bool:
        """Whether new weights reach the engine by restarting it from a checkpoint."""
        return self.weight_bridge_mode in RESTART_MODES


def build_parser(description: str = "") -> argparse.ArgumentParser:
    """`atropos-grpo`'s flags: one per field, and --lora-target-modules also as upstream's
    space-separated list (`q_proj v_proj`), which one value per flag would refuse."""
    parser = argparse.ArgumentParser(
        prog="atropos-grpo", description=description, conflict_handler="resolve"
    )
    add_model_flags(parser, TrainingConfig)
    field = TrainingConfig.model_fields["lora_target_modules"]
    parser.add_argument(
        "--lora-target-modules",
        dest="lora_target_modules",
        nargs="+",
        default=argparse.SUPPRESS,
        metavar="MODULE",
        help=f"{field.description} (default: {field.default!r})",
    )
    return parser


LAUNCH_CONFIG = TrainingConfig
"""What atropos-launch checks this trainer's flags against (atroposlib.trainer_contract).
Here, not only in grpo.py, so the launcher reads it without importing torch."""
