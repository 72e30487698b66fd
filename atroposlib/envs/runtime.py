"""The `serve` loop: an environment as a microservice of the trajectory API.

register (waiting for the trainer) -> /info -> loop:
  poll /status-env; run evaluations and env checkpoints when the trainer step
  crosses steps_per_eval / checkpoint_interval; stop once the trainer step plus
  queued work reaches total_steps; keep at most max_batches_offpolicy batches of
  this env's work queued, spooled or in flight (cancelling surplus workers back
  to the backlog); start workers up to max_num_workers scaled by the env weight;
  abandon workers after worker_timeout (<= 0: never, upstream's -1).

Failures in user code (collect_trajectories, evaluate, ...) are logged with the
item and traceback and counted; the loop goes on. SIGINT/SIGTERM stop it
cleanly: in-flight items go back to a backlog file that the next run reads
first, spooled groups are delivered (or kept for the next run), and the env
disconnects. Whatever a run takes over from an earlier one (spool, backlog, env
checkpoint) is logged as a WARNING with its count and path: state dirs are per
working directory, so a new run started by hand in the same place inherits it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
from pathlib import Path
from typing import Any

from atroposlib.envs.api_client import TrajectoryClient
from atroposlib.envs.config import EvalHandlingEnum
from atroposlib.protocol import RegisterEnv

logger = logging.getLogger("atroposlib.envs")

POLL_S = 0.5


def state_dir_for(env: Any) -> Path:
    root = os.environ.get("ATROPOS_ENV_STATE_DIR", ".atropos-env")
    return Path(root) / (env.config.wandb_name or env.name or type(env).__name__)


class EnvRuntime:
    def __init__(self, env: Any, state_dir: Path | None = None) -> None:
        self.env = env
        self.state_dir = state_dir or state_dir_for(env)
        self.backlog_file = self.state_dir / "backlog.json"
        self.backlog: list[Any] = []
        self.workers: dict[asyncio.Task, Any] = {}
        self.stopping = asyncio.Event()
        self.eval_task: asyncio.Task | None = None
        self.eval_blocking = False
        self.last_eval_bucket = 0
        self.last_checkpoint_bucket = 0
        self.last_logged_step = -1

    # ----------------------------------------------------------------- start
    async def run(self) -> None:
        env = self.env
        self._install_signal_handlers()
        await env.setup()
        self.client = TrajectoryClient(env.config.rollout_server_url, self.state_dir / "spool")
        env.client = self.client
        try:
            if await self._register():
                await self._loop()
        finally:
            await self._shutdown()

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self._request_stop, sig)
            except (NotImplementedError, RuntimeError):
                pass

    def _request_stop(self, sig: int) -> None:
        logger.info("received %s; stopping", signal.Signals(sig).name)
        self.stopping.set()

    async def _until_stopped(self, awaitable) -> Any:
        """Await `awaitable` unless a stop is requested first (then None)."""
        task = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self.stopping.wait())
        done, _ = await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            stop.cancel()
            return task.result()
        task.cancel()
        return None

    async def _register(self) -> bool:
        env, config = self.env, self.env.config
        registration = RegisterEnv(
            max_token_length=config.max_token_length,
            desired_name=config.wandb_name or env.name or type(env).__name__,
            weight=config.inference_weight,
            group_size=config.group_size,
            min_batch_allocation=config.min_batch_allocation,
        )
        answer = await self._until_stopped(self.client.register_env(registration.model_dump()))
        if answer is None:
            return False
        env.env_id = answer["env_id"]
        env.wandb_prepend = answer["wandb_name"]
        env.curr_step = answer["starting_step"]
        env.checkpoint_dir = answer.get("checkpoint_dir") or ""
        env.checkpoint_interval = answer.get("checkpoint_interval", -1)
        if config.total_steps == -1:  # upstream's "as many steps as the trainer runs"
            config.total_steps = answer.get("num_steps", -1)
            if config.total_steps == -1:
                raise ValueError("total_steps is -1 and the trainer registered no num_steps")
            logger.info("total_steps -1: running to the trainer's num_steps %d", config.total_steps)
        info = await self.client.get_json("/info")
        if config.batch_size == -1:
            config.batch_size = info["batch_size"]
        env.max_token_len = info["max_token_len"]
        if config.steps_per_eval > 0:
            self.last_eval_bucket = env.curr_step // config.steps_per_eval
        if env.checkpoint_interval and env.checkpoint_interval > 0:
            self.last_checkpoint_bucket = env.curr_step // env.checkpoint_interval
        if env.curr_step > 0:  # a fresh run (step 0) starts from nothing, as upstream
            env.load_checkpoint()
        self._restore_backlog()
        logger.info(
            "registered as %s (env_id %d), batch_size %d, step %d",
            env.wandb_prepend,
            env.env_id,
            config.batch_size,
            env.curr_step,
        )
        return True

    # ------------------------------------------------------------------ loop
    async def _loop(self) -> None:
        env = self.env
        while not self.stopping.is_set():
            delivered_before = self.client.records_delivered
            status = await self._until_stopped(self.client.status_env(env.env_id))
            if status is None:
                break
            # a group delivered while /status-env was answering may be missing
            # from self_queue_size and is already gone from the spool: count it
            in_transit = self.client.records_delivered - delivered_before
            env.curr_step = status["current_step"]
            queued_batches = (
                status["queue_size"] * env.config.group_size / max(1, env.config.batch_size)
            )
            # checked before evaluating: at the end the trainer may already have
            # stopped the engine that an evaluation would wait on
            if env.curr_step + queued_batches >= env.config.total_steps:
                logger.info(
                    "trainer step %d + queued work reached total_steps %d; done",
                    env.curr_step,
                    env.config.total_steps,
                )
                break
            await self._evaluate_and_checkpoint()
            budget = self._worker_budget(status, in_transit)
            self._cancel_surplus(budget)
            await self._start_workers(budget)
            await self._maybe_log()
            pending = set(self.workers) | {asyncio.ensure_future(asyncio.sleep(POLL_S))}
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED, timeout=POLL_S)

    def _worker_budget(self, status: dict[str, Any], in_transit: int) -> int:
        config = self.env.config
        weight = status.get("env_weight", 1.0)
        allowed_groups = math.floor(
            config.max_batches_offpolicy * config.batch_size * weight / config.group_size
        )
        room = (
            max(1, allowed_groups) - status["self_queue_size"] - in_transit - self.client.pending()
        )
        cap = config.max_num_workers
        if cap <= 0:
            cap = config.max_num_workers_per_node * len(self.env.server.servers)
        cap = max(1, int(cap * weight))
        if self.eval_blocking:
            cap = 0
        elif self.eval_task is not None and not self.eval_task.done():
            if config.eval_handling == EvalHandlingEnum.LIMIT_TRAIN:
                cap = max(1, int(cap * config.eval_limit_ratio))
        return max(0, min(room, cap))

    def _cancel_surplus(self, budget: int) -> None:
        surplus = len(self.workers) - budget
        for task in list(self.workers)[::-1][: max(0, surplus)]:
            self.backlog.insert(0, self.workers.pop(task))
            task.cancel()
            self.env.stats["workers_cancelled"] += 1

    async def _start_workers(self, budget: int) -> None:
        while len(self.workers) < budget and not self.stopping.is_set():
            item = self.backlog.pop(0) if self.backlog else await self.env.get_next_item()
            if item is None:
                return
            task = asyncio.get_running_loop().create_task(self._work(item))
            self.workers[task] = item
            task.add_done_callback(lambda t: self.workers.pop(t, None))

    async def _work(self, item: Any) -> None:
        env = self.env
        timeout = env.config.worker_timeout if env.config.worker_timeout > 0 else None
        try:
            groups, more = await asyncio.wait_for(env.collect_trajectories(item), timeout)
            groups = await env.postprocess_histories(groups)
            await env.handle_send_to_api(groups, item)
            self.backlog.extend(more or [])
        except asyncio.CancelledError:
            raise
        except asyncio.TimeoutError:
            env.stats["worker_timeouts"] += 1
            logger.warning(
                "rollout of item %r timed out after %ss", item, env.config.worker_timeout
            )
        except Exception:
            env.stats["rollout_errors"] += 1
            logger.exception("rollout of item %r failed", item)
        finally:
            try:
                await env.cleanup()
            except Exception:
                logger.exception("cleanup failed")

    async def _evaluate_and_checkpoint(self) -> None:
        env, config = self.env, self.env.config
        if env.checkpoint_interval and env.checkpoint_interval > 0:
            bucket = env.curr_step // env.checkpoint_interval
            if bucket > self.last_checkpoint_bucket:
                self.last_checkpoint_bucket = bucket
                # the trainer's checkpoint step, which a poll may have seen only later
                env.save_checkpoint(bucket * env.checkpoint_interval)
        if config.steps_per_eval <= 0:
            return
        bucket = env.curr_step // config.steps_per_eval
        if bucket <= self.last_eval_bucket or (self.eval_task and not self.eval_task.done()):
            return
        self.last_eval_bucket = bucket
        if config.eval_handling == EvalHandlingEnum.STOP_TRAIN:
            self.eval_blocking = True
            try:
                await self._until_stopped(self._guarded_evaluate())
            finally:
                self.eval_blocking = False
        else:
            self.eval_task = asyncio.get_running_loop().create_task(self._guarded_evaluate())

    async def _guarded_evaluate(self) -> None:
        try:
            await self.env.evaluate()
        except Exception:
            self.env.stats["eval_errors"] += 1
            logger.exception("evaluate() failed")

    async def _maybe_log(self) -> None:
        env = self.env
        if (
            env.items_sent_this_step >= env.config.min_items_sent_before_logging
            and env.curr_step != self.last_logged_step
        ):
            self.last_logged_step = env.curr_step
            env.items_sent_this_step = 0
            try:
                await env.wandb_log()
            except Exception:
                logger.exception("wandb_log failed")

    # -------------------------------------------------------------- shutdown
    def _restore_backlog(self) -> None:
        if self.backlog_file.exists():
            restored = json.loads(self.backlog_file.read_text())
            self.backlog = restored + self.backlog
            self.backlog_file.unlink()
            logger.warning(
                "restored %d backlog items from an earlier run (%s); they are rolled out first",
                len(restored),
                self.backlog_file,
            )

    async def _shutdown(self) -> None:
        for task, item in list(self.workers.items()):
            task.cancel()
            self.backlog.insert(0, item)
        if self.workers:
            await asyncio.gather(*self.workers, return_exceptions=True)
        if self.eval_task is not None:
            self.eval_task.cancel()
        if self.backlog:
            try:
                self.state_dir.mkdir(parents=True, exist_ok=True)
                self.backlog_file.write_text(json.dumps(self.backlog))
                logger.info("%d unfinished items saved to %s", len(self.backlog), self.backlog_file)
            except (TypeError, ValueError):
                logger.warning(
                    "backlog items are not JSON-serialisable; %d dropped", len(self.backlog)
                )
        client = getattr(self, "client", None)
        if client is not None:
            if self.env.env_id is not None:
                try:
                    await asyncio.wait_for(
                        client.http.post("/disconnect-env", json={"env_id": self.env.env_id}), 5
                    )
                except Exception:
                    logger.info("could not tell the API this env disconnected")
            await client.close()
