"""`atropos-grpo`: the example GRPO trainer.

register with the API -> start the inference engine on the base model -> loop:
pull a batch, train one step (micro-batches packed by length, loss in
`loss.py`), and hand the new weights to the engine so environments sample from
the current policy: a hot mode pushes them into the running engine every
`--weight-sync-interval` steps, a restart mode checkpoints and restarts it every
`--engine-restart-interval` steps (`atroposlib.weight_sync`). Checkpoints follow
`--save-checkpoint-interval`; the last step always saves. An engine that dies
is restarted from the newest weights it can load, and a restart that fails is
retried, then falls back to the previous checkpoint (the library's engine fleet,
`atroposlib.inference.fleet`; `serving.py` is the trainer's side). Ctrl-C writes a
final checkpoint and stops the engine. Under torchrun, rank 0 alone does the
talking (API, engine, checkpoints, metrics); see `distributed.py`.

The `Trainer` holds its parts: the policy's forward (`policy_forward.py`), the
objective (`objective.py`), the engines (`serving.py`) and the step log
(`step_report.py`); it decides only the order of a step.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from pathlib import Path

import torch

from atroposlib.inference.launcher import COMMAND_LOGGER
from atroposlib.protocol import ScoredData, group_id_of
from atroposlib.trainer_contract import FINAL_EXIT_CODE, EventKind, RunRecords
from atroposlib.utils.flags import parse_settings
from atroposlib.utils.logging import configure_logging, keep_debug_in_files
from example_trainer.api import APIRefused, TrajectoryAPI
from example_trainer.checkpoint import (
    load_trainer_state,
    prune_checkpoints,
    save_checkpoint,
    save_sharded_checkpoint,
)

# what atropos-launch checks this trainer's flags against (atroposlib.trainer_contract)
from example_trainer.config import LAUNCH_CONFIG as LAUNCH_CONFIG
from example_trainer.config import TrainingConfig, build_parser
from example_trainer.data import (
    BatchGroups,
    MicroBatch,
    Sequence,
    drop_stale,
    flatten,
    micro_batches,
    split_trainable,
    staleness,
    teacher_latency,
    trained_tokens,
)
from example_trainer.distributed import init_data_parallel
from example_trainer.interrupts import StepInterrupts
from example_trainer.model import (
    MasterWeights,
    build_optimizer,
    compute_dtype,
    enable_gradient_checkpointing,
    load_policy,
)
from example_trainer.objective import Objective, StepMetrics, forward_inputs
from example_trainer.policy_forward import PolicyForward
from example_trainer.reference import ReferencePolicy
from example_trainer.serving import PolicyServing
from example_trainer.sharding import padded_micro_batch_count
from example_trainer.step_report import CompletionEnds, StepLog, rollout_numbers
from example_trainer.vision import ImageCheck, VisionInputs

NOTHING_TRAINED = dict.fromkeys(
    (
        *("loss", "pg_loss", "kl", "clip_fraction", "logprob_mismatch", "grad_norm"),
        *("score_mean", "score_std", "advantage_mean", "tokens", "sequences"),
        "sequences_without_inference_logprobs",
    ),
    0.0,
)
"""The metrics of a step that trained nothing: every group was skipped as untrainable,
or every sequence was too stale (--max-staleness)."""

logger = logging.getLogger("example_trainer")


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Trainer:
    """The GRPO trainer: pulls batches from the API, trains one step each, syncs weights.

    It owns the policy, the optimizer and the engines for one rank; `run` decides when
    to checkpoint and hand weights over, and under torchrun rank 0 alone talks to the API.
    """

    def __init__(self, config: TrainingConfig) -> None:
        self.config = config
        if config.parallel.num_threads:
            torch.set_num_threads(config.parallel.num_threads)
        torch.manual_seed(config.model.seed)
        random.seed(config.model.seed)
        self.sharded = config.parallel.parallelism == "fsdp"  # one process is a group of one rank
        self.parallel, self.device = init_data_parallel(
            pick_device(config.parallel.device), group_of_one=self.sharded
        )
        self.model, self.tokenizer, restore_optimizer = load_policy(
            config, self.device, sharded=self.sharded
        )
        if config.model.gradient_checkpointing:
            enable_gradient_checkpointing(self.model)
        self.model.train()
        self.vision = VisionInputs.for_model(config.checkpoint.resume or config.model.model_name)
        # what a checkpoint saves beside the weights: a VLM's engine needs its processor
        preprocessor = self.vision.processor if self.vision else self.tokenizer
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        self.ends = CompletionEnds(self.tokenizer, self.model)  # completions/clipped_ratio
        self.skipped_groups: set[int] = set()
        """Indices, in the last step's batch, of the groups it could not train on."""
        self.forward = PolicyForward(self.model, config, self.parallel, self.device, self.sharded)
        reference = (
            ReferencePolicy(config, self.model, self.forward.module, self.device)
            if config.loss.kl_reference == "model"
            else None
        )
        self.objective = Objective(config, reference)
        self.master = MasterWeights(self.model)
        self.optimizer = build_optimizer(self.master.params, config)
        warmup = max(1, config.optim.warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup)
        )
        resume = config.checkpoint.resume
        self.step = (
            load_trainer_state(
                resume,
                self.optimizer,
                self.scheduler,
                restore_optimizer,
                self.master.stepped_module(self.model),
            )
            if resume
            else 0
        )
        self.master.publish()  # the resumed masters, rounded into the model's own weights
        self.latest_checkpoint = resume or config.model.model_name
        # the newest step a checkpoint holds: the API keeps later batches for a resume
        self.committed_step = self.step
        self.records = RunRecords(config.checkpoint.save_path)
        self.serving = PolicyServing(
            config, self.records, self.model, preprocessor, self.sharded
        )  # its engines start on rank 0 (`run`)
        self.step_log = StepLog(self.records, config)
        self._warned_missing_logprobs = False
        self._warned_text_only = False

    @property
    def engines(self) -> list:
        return self.serving.engines

    def ensure_engines(self) -> float:
        """Restart dead engines on the newest weights they can load; seconds spent."""
        return self.serving.ensure(self.step)

    # -------------------------------------------------------------- train
    def train_step(self, batch: BatchGroups) -> dict[str, float]:
        """One optimizer step on `batch`, less the groups it cannot train on and, with
        --max-staleness, the sequences sampled too many versions ago (both counted)."""
        config = self.config
        groups, skipped = split_trainable(batch, self.vocab_size, self.image_check())
        for reason in skipped.values():
            logger.warning(
                "step %d: skipping a group it cannot train on: %s", self.step + 1, reason
            )
        sequences = self.sequences(groups)
        fresh, dropped = drop_stale(sequences, self.step, config.batching.max_staleness)
        # a group none of whose sequences is fresh enough was consumed, not trained
        trainable = [n for n in range(len(groups) + len(skipped)) if n not in skipped]
        trained_groups = {s.group for s in fresh}
        stale_groups = [trainable[g] for g in range(len(groups)) if g not in trained_groups]
        self.skipped_groups = set(skipped) | set(stale_groups)
        counts = {
            **rollout_numbers(sequences, self.ends),
            "skipped_groups": float(len(skipped)),
            "stale_sequences_dropped": float(dropped),
            **staleness(fresh, self.step),
            **teacher_latency(groups),
        }
        lr = float(self.scheduler.get_last_lr()[0])  # a float: the optimizer is given one
        if not fresh:  # nothing to learn from; the step still counts, as the API's does
            self.scheduler.step()
            return {**NOTHING_TRAINED, **counts, "lr": lr}
        metrics = self.accumulate_gradients(fresh)
        self.master.take_grads()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.master.params, config.optim.max_grad_norm)
        if hasattr(grad_norm, "full_tensor"):  # FSDP: a norm over every rank's shards
            grad_norm = grad_norm.full_tensor()
        self.optimizer.step()
        self.master.publish()
        self.scheduler.step()  # lr above was this step's; this moves to the next
        self.optimizer.zero_grad(set_to_none=True)
        return {**metrics, **counts, "grad_norm": float(grad_norm), "lr": lr}

    def image_check(self) -> ImageCheck | None:
        """A vision-language policy checks each sequence's image tokens, as trained (cut
        at --seq-len)."""
        vision, seq_len = self.vision, self.config.batching.seq_len
        if vision is None:
            return None
        return lambda tokens, pictures: vision.problem(tokens[:seq_len], pictures)

    def pixels(self, chunk: MicroBatch) -> dict[str, torch.Tensor] | None:
        """The micro-batch's picture inputs on the device, made by the policy's processor."""
        if chunk.pictures is None:
            return None
        if self.vision is None:
            if not self._warned_text_only:
                self._warned_text_only = True
                logger.warning("groups carry images; this text-only policy trains on the text")
            return None
        made = self.vision.tensors(chunk.pictures, compute_dtype(self.config))
        return {name: value.to(self.device) for name, value in made.items()}

    def sequences(self, groups: BatchGroups) -> list[Sequence]:
        """The groups' rollouts with their advantages, as the flags say (`data.flatten`)."""
        config = self.config
        return flatten(
            groups,
            config.loss.scale_advantages or "group",
            config.batching.seq_len,
            config.batching.require_inference_logprobs,
            config.loss.advantage_estimator,
        )

    def accumulate_gradients(self, sequences: list[Sequence]) -> dict[str, float]:
        """Backward over this rank's share of the batch; gradients are the whole batch's."""
        config = self.config
        without_old = sum(s.inference_logprobs is None for s in sequences)
        if without_old and not self._warned_missing_logprobs:
            self._warned_missing_logprobs = True
            logger.warning(
                "%d of %d sequences came without inference_logprobs: they train with ratio 1 "
                "(no clipping against the policy that sampled them); counted per step as "
                "sequences_without_inference_logprobs (--require-inference-logprobs refuses "
                "them instead)",
                without_old,
                len(sequences),
            )
        total_tokens = sum(trained_tokens(s) for s in sequences)
        local = self.parallel.shard(sequences, lambda s: len(s.tokens))
        chunks = micro_batches(
            local,
            config.batching.gradient_accumulation_steps,
            self.tokenizer.pad_token_id or 0,
            config.batching.micro_batch_tokens,
            self.forward.packs,
            self.forward.shares_prompts,
        )
        step_metrics = StepMetrics(self.objective.settings, total_tokens)
        count = padded_micro_batch_count(
            len(chunks), self.sharded and self.parallel.enabled, self.device
        )
        if self.parallel.enabled:  # an empty share still meets the gradient all-reduce
            count = max(count, 1)
        for index in range(count):
            last = index == count - 1
            if index >= len(chunks):  # this rank's share ran out, its collectives not
                pad = self.tokenizer.pad_token_id or 0
                self.forward.idle_pass(last, pad, self.objective.reference)
                continue
            chunk = chunks[index]
            with self.forward.gradient_sync(last):
                inputs = forward_inputs(chunk, self.device)
                shared = None if chunk.shared is None else chunk.shared.to(self.device)
                extra = self.objective.extra_ids(chunk, self.device)
                chunk.pixels = self.pixels(chunk)
                output = self.forward(*inputs, shared, extra, pixels=chunk.pixels)
                loss, metrics = self.objective.loss(chunk, output, total_tokens, len(sequences))
                (loss * self.parallel.world_size).backward()
            step_metrics.add(loss.detach().item(), metrics)
        joined = StepMetrics.finished(self.parallel.sum(step_metrics.sums), total_tokens)
        joined.update(self.parallel.max(step_metrics.maxima))
        return {
            **joined,
            "advantage_mean": float(
                sum(sum(s.advantages) / max(len(s.advantages), 1) for s in sequences)
                / len(sequences)
            ),
            "tokens": float(total_tokens),
            "sequences": float(len(sequences)),
            "sequences_without_inference_logprobs": float(without_old),
        }

    def save(self) -> Path:
        """Checkpoint the current step; it becomes what a restarted engine serves. Under
        FSDP every rank calls this (each writes its optimizer shard); otherwise rank 0."""
        config = self.config
        self.serving.settle()  # a checkpoint step's pruning and restarts see every engine
        parts = (config.checkpoint.save_path, self.step, self.model, self.serving.tokenizer)
        if self.sharded:
            dtype = compute_dtype(config)
            path = save_sharded_checkpoint(*parts, self.optimizer, self.scheduler, dtype)
        else:
            masters = self.master.stepped_module(self.model)
            path = save_checkpoint(*parts, self.optimizer, self.scheduler, masters)
        self.latest_checkpoint = str(path)
        self.committed_step = self.step
        self.serving.committed(str(path), self.step)
        if not self.parallel.is_main:
            return path
        self.records.event(EventKind.CHECKPOINT_SAVED, self.step, path=str(path))
        # the served checkpoints are where a failed restart falls back to
        serving = [engine.serving for engine in self.engines]
        checkpoints = config.checkpoint
        removed = prune_checkpoints(
            checkpoints.save_path, checkpoints.keep_checkpoints, protect=serving
        )
        if removed:
            logger.info("removed %s (--keep-checkpoints)", ", ".join(map(str, removed)))
            for engine in self.engines:
                engine.forget([str(path) for path in removed])
        return path

    def checkpoint_and_restart(self) -> float:
        """Every engine restarts on the new checkpoint, one after another, so the others
        serve meanwhile; seconds spent."""
        path = self.save()
        return self.serving.restart_all(str(path), self.step)

    def hand_over_weights(self) -> None:
        """After a step: restart modes checkpoint and restart at their interval (the
        step's records are written before, since the checkpoint commits the step)."""
        config = self.config
        if (
            config.weight_sync.restarts_engine
            and self.step % config.weight_sync.engine_restart_interval == 0
        ):
            # with --inference-engine none the checkpoint is what an external engine loads
            restart = self.checkpoint_and_restart()
            if self.engines:
                logger.info("engine restarted on step %d in %.1fs", self.step, restart)
            return
        interval = config.checkpoint.save_checkpoint_interval
        if interval and self.step % interval == 0 and self.committed_step != self.step:
            self.save()

    def log(self, metrics: dict[str, float]) -> None:
        self.step_log.log(self.step, metrics)

    def next_batch(self, api: TrajectoryAPI | None) -> tuple[list[ScoredData], float]:
        """rank 0 polls the API; every rank gets its batch."""
        batch, waited = (
            api.wait_for_batch(
                self.step + 1,
                self.committed_step,
                self.config.batching.batch_poll_s,
                self.ensure_engines,
            )
            if api is not None
            else (None, 0.0)
        )
        return self.parallel.broadcast((batch, waited))

    def run(self) -> None:
        config, main_rank = self.config, self.parallel.is_main
        api = (
            TrajectoryAPI(
                config.batching.atropos_url,
                config.batching.api_timeout_s,
                config.batching.batch_wait_s,
            )
            if main_rank
            else None
        )
        hands_over = main_rank or self.sharded  # FSDP: every rank gathers and writes
        if api is not None:  # the main rank
            self.serving.start(self.latest_checkpoint, self.step)
            api.register(config, self.step, self.vocab_size)
        # an adapter or shared memory goes in before environments ask for the policy
        bridge = self.serving.bridge
        if self.parallel.broadcast(bridge is not None and bridge.push_at_start):
            if hands_over:
                self.serving.push(self.step)
        interrupts = StepInterrupts()
        interrupts.install()
        try:
            while self.step < config.optim.training_steps:
                batch, waited = self.next_batch(api)
                with interrupts.step():  # a signal waits for the step to end
                    started = time.perf_counter()
                    metrics = self.train_step(batch)
                    self.step += 1
                    trained = time.perf_counter() - started
                    synced = 0.0
                    last = self.step == config.optim.training_steps
                    if hands_over and self.serving.pushes_at(self.step):
                        synced = self.serving.push(self.step)
                    if main_rank:
                        # both records before the checkpoint: a step it holds is on record
                        ids = [group_id_of(g) for g in batch]
                        self.records.trained_groups(
                            self.step,
                            [i for n, i in enumerate(ids) if n not in self.skipped_groups],
                            [i for n, i in enumerate(ids) if n in self.skipped_groups],
                        )
                        metrics.update(
                            wait_s=waited,
                            train_s=trained,
                            sync_s=synced,
                            tokens_per_s=metrics["tokens"] / max(trained, 1e-9),
                        )
                        self.log(metrics)
                    if hands_over:
                        if last:
                            self.save()  # the engine stops next: syncing it would be wasted
                        else:
                            self.hand_over_weights()
        except KeyboardInterrupt:
            if hands_over and self.committed_step != self.step:
                logger.info("interrupted at step %d; writing a final checkpoint", self.step)
                self.save()
            elif main_rank and self.step == 0:
                logger.info("interrupted before its first step: nothing to checkpoint")
            elif main_rank:
                logger.info("interrupted at step %d, which is already checkpointed", self.step)
        finally:
            interrupts.uninstall()
            self.serving.stop()
            self.step_log.close()
            self.parallel.close()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(__doc__.splitlines()[0])
    config, _ = parse_settings(parser, TrainingConfig, argv)
    configure_logging("info", config.logging.log_format)
    keep_debug_in_files(COMMAND_LOGGER)  # the engine's whole command, in logs/trainer.log
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a bar per weight export would flood the log
    trainer = Trainer(config)
    if not trainer.parallel.is_main:
        logging.getLogger().setLevel(logging.WARNING)
    try:
        trainer.run()
    except APIRefused as exc:  # the API's answer says what is wrong; a traceback adds nothing
        print(f"atropos-grpo: {exc}", file=sys.stderr)
        return FINAL_EXIT_CODE  # asking again would be refused again
    return 0


if __name__ == "__main__":
    sys.exit(main())
