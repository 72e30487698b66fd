"""The sections of `TrainingConfig`, one pydantic model each (`config.py` joins them).

Each section is what one part of the trainer reads (`config.loss` the objective,
`config.weight_sync` the bridge, `config.engine` the engine fleet), and holds the
rules among its own fields; rules across sections live on `TrainingConfig`. Flags
stay flat (`--lr`), as upstream's (`atroposlib.utils.sections`), and upstream's other
spellings are declared on their field, once (`AliasChoices`).
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator

from atroposlib.inference.engines import engine_name
from atroposlib.utils.exposure import engine_args_problem
from atroposlib.utils.sections import Section
from atroposlib.weight_sync.modes import RESTART_MODES, WeightBridgeMode
from example_trainer.losses import (
    LOSSES,
    DistillMode,
    LossType,
    load_loss,
    loss_kind,
    ratio_level,
)

UPSTREAM_LOSS_NORMALIZATION = {"token": "dapo", "sequence": "grpo"}
"""Upstream's --loss-normalization values, which are --loss-type's by another name."""
HOT_MODE_CHECKPOINT_INTERVAL = 10
"""Steps between checkpoints in a hot mode by default: what a trainer crash re-trains."""


class ModelSection(Section):
    """The policy: which model, in what dtype, and its random state."""

    model_name: str = Field(..., description="Policy to train: hub name or local directory.")
    dtype: str = Field("float32", description="Training and engine dtype: float32 or bfloat16.")
    disable_dropout: bool = Field(
        True,
        description="Turn every dropout of the policy off, LoRA's included, as TRL's "
        "disable_dropout: the PPO ratio, the importance weights and --shared-prompt-forward "
        "assume each forward is the same function; dropout's noise would be clipped as if "
        "it were the policy's change.",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer in backward instead of keeping its "
        "activations: less memory for about a third more step time.",
    )
    freeze_vision_tower: bool = Field(
        True,
        description="A vision-language policy's picture encoder gets no gradient (as TRL's "
        "and verl's default): its projector and language model train (docs/trainer.md, "
        "Vision-language models).",
    )
    seed: int = Field(0, description="Random seed.")


class LoraSection(Section):
    """LoRA adapters, for the lora_* weight bridge modes."""

    lora_r: int = Field(16, description="LoRA rank.")
    lora_alpha: int = Field(32, description="LoRA alpha.")
    lora_dropout: float = Field(
        0.05, description="LoRA dropout (in effect only with --disable-dropout false)."
    )
    lora_target_modules: str = Field(
        "q_proj,v_proj",
        description="Module names LoRA adapts: comma-separated, or space-separated as "
        "upstream's (--lora-target-modules q_proj v_proj).",
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


class OptimSection(Section):
    """The optimizer and its schedule."""

    lr: float = Field(1e-5, gt=0, description="Peak learning rate.")
    training_steps: int = Field(10, ge=1, description="Optimizer steps (one batch each).")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps.")
    optimizer: Literal["adamw", "adamw_8bit", "adafactor"] = Field(
        "adamw", description="adamw, adamw_8bit (bitsandbytes) or adafactor (transformers)."
    )
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")


class BatchingSection(Section):
    """What a step trains on: the batch it pulls from the API, and its micro-batches."""

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
        "--entropy-coef, --distill-mode forward_topk or --gradient-checkpointing, which run "
        "rows whole.",
    )
    max_staleness: int | None = Field(
        None,
        ge=0,
        description="Train no sequence sampled more than K versions before the step that "
        "trains it: such sequences are dropped and counted (stale_sequences_dropped), and "
        "environments start no rollout that would arrive staler (docs/trainer.md, "
        "Off-policy control). Default: no bound, as upstream.",
    )
    require_inference_logprobs: bool = Field(
        False,
        description="Refuse groups without inference_logprobs, as upstream does "
        "(default: train them with ratio 1 and warn).",
    )
    atropos_url: str = Field("http://localhost:8000", description="Trajectory API URL.")
    api_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Seconds a call to the API may take before it is abandoned and asked again "
        "(a stalled API is waited out, never fatal).",
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

    @model_validator(mode="after")
    def _one_way_to_cut_micro_batches(self) -> BatchingSection:
        if self.micro_batch_tokens is not None and self.gradient_accumulation_steps != 1:
            raise ValueError(
                "--micro-batch-tokens and --gradient-accumulation-steps both decide the "
                "micro-batches; give one"
            )
        return self


class LossSection(Section):
    """The policy loss, its advantages and its corrections (docs/trainer.md, The loss)."""

    loss_type: LossType = Field(
        "dapo",
        validation_alias=AliasChoices("loss_type", "loss_normalization"),
        description="Policy loss, as TRL's loss_type: dapo (clipped ratio, averaged over all "
        "trained tokens of the batch), grpo (each sequence's mean, averaged over sequences), "
        "dr_grpo (summed, divided by sequences x --seq-len; no std scaling by default), cispo "
        "(a clipped, stop-gradient IS weight on the log-likelihood, capped at --clip-eps-high, "
        "default 5), gspo (grpo on each sequence's ratio, clipped at 3e-4/4e-4 by default). "
        "See docs/trainer.md, The loss. "
        f"Registered: {', '.join(sorted(LOSSES))}. Upstream's --loss-normalization token "
        "is dapo, sequence is grpo.",
    )
    loss_import_path: str | None = Field(
        None,
        description="A loss of your own instead of --loss-type: module:function, a "
        "function of example_trainer.losses.LossInputs returning LossOutputs (registered "
        "with @register_loss for a normaliser other than per token). See docs/trainer.md, "
        "Adding a loss.",
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
    ratio_reference: Literal["inference", "trainer"] | None = Field(
        None,
        description="The PPO ratio's denominator: the rollout's inference_logprobs (inference, "
        "upstream's) or the trainer's own logprobs before the update (trainer, TRL's and "
        "verl's). Default: trainer with --vllm-importance-sampling-correction, else inference.",
    )
    no_reference_logprobs: bool = Field(
        False,
        description="Upstream's flag: the rollout's inference_logprobs are not the ratio's "
        "denominator. Here that is --ratio-reference trainer (ratio 1: a REINFORCE-style "
        "step, as upstream described it).",
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
    distill_coef: float = Field(
        0.0,
        ge=0,
        description="Weight of the distillation term, for groups that carry a teacher's "
        "distill_token_ids/distill_logprobs (TeacherDistillationEnv); 0 trains on rewards "
        "alone (the KL to the teacher is still reported). See docs/trainer.md, Distillation.",
    )
    distill_mode: DistillMode = Field(
        "reverse_kl",
        description="reverse_kl: the sampled token's log-ratio to the teacher as a per-token "
        "reward (Tinker's recipe); forward_topk: KL from the teacher's renormalised top-k to "
        "the policy at every listed token.",
    )

    @field_validator("loss_type", mode="before")
    @classmethod
    def _upstream_normalization(cls, value: Any) -> Any:
        return UPSTREAM_LOSS_NORMALIZATION.get(value, value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _loss_choice(self) -> LossSection:
        """Resolve the defaults that depend on the loss, and refuse what contradicts it."""
        if self.no_reference_logprobs:
            if self.ratio_reference == "inference":
                raise ValueError(
                    "--no-reference-logprobs is --ratio-reference trainer, but --ratio-reference "
                    "inference was given; give one"
                )
            self.ratio_reference = "trainer"
            self.no_reference_logprobs = False
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
        if kind.default_clip_eps is not None and "clip_eps" not in self.model_fields_set:
            self.clip_eps = kind.default_clip_eps
        given = "importance_sampling_level" in self.model_fields_set
        self.importance_sampling_level = ratio_level(kind, self.importance_sampling_level, given)
        self._check_correction()
        if self.kl_reference == "model" and self.kl_coef == 0:
            raise ValueError("--kl-reference model computes a reference for a KL: set --kl-coef")
        return self

    def _check_correction(self) -> None:
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


class EngineSection(Section):
    """The inference engines the trainer starts and keeps serving the policy."""

    inference_engine: str = Field(
        "auto",
        description="Engine to run: a registered kind (cpu, vllm; transformers is cpu), "
        "auto (vllm on a GPU it can use, else cpu), or none (an external one).",
    )
    inference_python: str | None = Field(
        None, description="Python that runs the engine (e.g. a vLLM venv; default: this one)."
    )
    engine_args: str = Field("", description="Extra engine flags, space separated.")
    num_engines: int = Field(
        1,
        ge=1,
        le=64,
        description="Inference engines to start and keep in sync, on ports --engine-port, "
        "--engine-port + 1, ...: each new version is pushed to all of them at once, and one "
        "that dies or fails a push is restarted while the others serve on.",
    )
    engine_device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda(:\d+)?)(,(cpu|cuda(:\d+)?))*$",
        description="Where the engines run: cpu, cuda or cuda:N, or a comma-separated list "
        "taken in turn by --num-engines engines (auto: the CPU engine on cpu, vLLM on the "
        "GPU it finds).",
    )
    engine_port: int = Field(
        9001,
        validation_alias=AliasChoices("engine_port", "vllm_port"),
        description="Port of the inference engine (the first, with --num-engines).",
    )
    gpu_memory_utilization: float = Field(
        0.45,
        validation_alias=AliasChoices("gpu_memory_utilization", "vllm_gpu_memory_utilization"),
        description="vLLM's GPU memory share.",
    )
    served_model_name: str | None = Field(
        None, description="Name environments use for the policy (default: --model-name)."
    )
    max_model_len: int | None = Field(None, description="Engine context length (default: seq_len).")

    @field_validator("inference_engine")
    @classmethod
    def _registered_engine(cls, value: str) -> str:
        return value if value == "none" else engine_name(value)

    @field_validator("engine_args")
    @classmethod
    def _engine_args_keep_loopback(cls, value: str) -> str:
        problem = engine_args_problem(shlex.split(value))
        if problem:
            raise ValueError(problem)
        return value

    def device_of(self, index: int) -> str:
        """The device of engine `index` (0-based) from --engine-device."""
        devices = self.engine_device.split(",")
        return devices[index % len(devices)]


class WeightSyncSection(Section):
    """How new weights reach the engines (docs/trainer.md, Weight sync)."""

    weight_bridge_mode: WeightBridgeMode = Field(
        "none",
        description="How new weights reach the engine: none or restart (checkpoint + engine "
        "restart), hot_reload (full weights into the running engine), lora_only (LoRA "
        "adapters into the running engine), lora_restart (LoRA, merged, restart), "
        "shared_vllm (one copy of the weights shared with vLLM through CUDA IPC). "
        "See docs/trainer.md.",
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
    engine_restart_interval: int = Field(
        3,
        ge=1,
        validation_alias=AliasChoices("engine_restart_interval", "vllm_restart_interval"),
        description="Restart modes (none, restart, lora_restart): checkpoint and restart the "
        "inference engine every N steps.",
    )

    @property
    def restarts_engine(self) -> bool:
        """Whether new weights reach the engine by restarting it from a checkpoint."""
        return self.weight_bridge_mode in RESTART_MODES


class CheckpointSection(Section):
    """Resumable checkpoints."""

    save_path: str = Field("trained_model_checkpoints", description="Where checkpoints go.")
    save_checkpoint_interval: int | None = Field(
        None,
        ge=0,
        validation_alias=AliasChoices("save_checkpoint_interval", "checkpoint_interval"),
        description="Write a resumable checkpoint every N steps (0: only those a restart "
        "mode needs, and the last). Independent of weight syncs. Default: every "
        f"{HOT_MODE_CHECKPOINT_INTERVAL} steps in the hot modes, whose syncs write no "
        "checkpoint, so a crash re-trains at most that many steps; 0 in the restart modes, "
        "whose engine restarts checkpoint already.",
    )
    keep_checkpoints: int = Field(
        0,
        ge=0,
        description="Keep only the N newest checkpoints, plus the one the engine serves (0: all).",
    )
    resume: str | None = Field(None, description="Checkpoint directory to continue from.")


class ParallelSection(Section):
    """Where the trainer computes: device, threads, and the ranks' sharding under torchrun."""

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
    num_threads: int | None = Field(
        None, ge=1, description="torch threads (trainer and CPU engine)."
    )

    @model_validator(mode="after")
    def _fsdp_modes(self) -> ParallelSection:
        if self.fsdp_cpu_offload and self.parallelism != "fsdp":
            raise ValueError("--fsdp-cpu-offload needs --parallelism fsdp")
        return self


class LoggingSection(Section):
    """The console and the experiment trackers (Weights & Biases, trackio)."""

    use_wandb: bool = Field(False, description="Log to Weights & Biases (offline without a key).")
    wandb_project: str = Field("atropos-grpo", description="wandb project.")
    wandb_group: str = Field("grpo", description="wandb group (also sent to the API).")
    use_trackio: bool = Field(
        False,
        description="Log to trackio (pip install trackio): local, under $TRACKIO_DIR (default: "
        "the Hugging Face cache's trackio/); see it with trackio show.",
    )
    trackio_project: str = Field("atropos-grpo", description="trackio project.")
    run_name: str | None = Field(
        None, description="The run's name in wandb and trackio (default: one they make up)."
    )
    log_format: Literal["auto", "rich", "text", "json"] = Field(
        "auto", description="Console logs: rich on a terminal (auto), rich, text or json."
    )
