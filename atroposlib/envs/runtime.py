"""The `serve` loop: an environment as a microservice of the trajectory API.

The steps an env can override are its methods, called here at upstream's
points (`serve_hooks.py`): setup_wandb -> register_env (both wait for the
trainer) -> get_server_info -> loop: get_status (/status-env);
env_step_checks, whose base runs evaluations and env checkpoints when the
trainer step crosses steps_per_eval / checkpoint_interval; stop once the trainer step plus
  queued work reaches total_steps; keep at most max_batches_offpolicy batches of
  this env's work queued, spooled or in flight, fewer when the trainer bounds
  staleness (admission.py), cancelling surplus workers back to the backlog;
  start workers up to max_num_workers scaled by the env weight;
  abandon workers after worker_timeout (<= 0: never, upstream's -1).

Failures in user code (collect_trajectories, evaluate, ...) are counted and logged
with the item and traceback, a rollout's or an evaluation's once per place it was
raised, and a context refusal once as one line (`rollout_failures.py`); the loop goes
on. SIGINT/SIGTERM stop it cleanly: in-flight items go back to a backlog file that
the next run reads first, spooled groups are delivered (or kept for the next run),
and the env disconnects. Whatever a run takes over from an earlier one (spool,
backlog, env checkpoint) is logged as a WARNING with its count and path: state dirs
are per working directory, so a new run started by hand in the same place inherits it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atroposlib.envs.admission import offpolicy_window
from atroposlib.envs.api_client import TrajectoryClient
from atroposlib.envs.config import EvalHandlingEnum
from atroposlib.envs.eval import EVAL_HISTORY
from atroposlib.envs.rollout_failures import EvaluationFailures, NoRolloutFits, RolloutFailures
from atroposlib.utils.logging import MESSAGE_WIDTH, short_path

if TYPE_CHECKING:
    from atroposlib.envs.served_env import ServedEnv

logger = logging.getLogger("atroposlib.envs")
STATE_LOGGER = "atroposlib.envs.state"
"""Where a run's state files are, whole, at DEBUG for log files (`keep_debug_in_files`);
the console line names them in short."""
state_logger = logging.getLogger(STATE_LOGGER)

POLL_S = 0.5


def state_dir_for(env: ServedEnv) -> Path:
    root = os.environ.get("ATROPOS_ENV_STATE_DIR", ".atropos-env")
    return Path(root) / (env.config.wandb_name or env.name or type(env).__name__)


class EnvRuntime:
    """One environment's `serve` loop: workers, backlog, pacing, evals and checkpoints.

    It owns the loop's state and shares two lists with the env (`backlog`, `workers`),
    which upstream environments read and extend; everything else stays here. What it
    reads, calls and sets on the env is `ServedEnv` (served_env.py), which BaseEnv meets.
    """

    client: TrajectoryClient
    """The trajectory API's client, made when `run` starts; the env's `client` reads it."""
    window_narrowed_logged = False
    """True once the INFO line that the trainer's max_staleness narrowed the window went out."""

    def __init__(self, env: ServedEnv, state_dir: Path | None = None) -> None:
        self.env = env
        self.state_dir = state_dir or state_dir_for(env)
        self.backlog_file = self.state_dir / "backlog.json"
        # the env's own backlog, so that env code reading or extending it (upstream
        # envs do) sees the runtime's; the env's `workers` property reads ours
        self.backlog: list[Any] = env.backlog
        self.workers: dict[asyncio.Task, Any] = {}
        self.running_items: dict[str, dict[str, Any]] = {}  # name -> item, worker, start
        self.last_loop_time: float | None = None
        self.last_completed_item: Any = None
        self.kept = 0  # rollouts that gave groups, since this process started
        self.stopping = asyncio.Event()
        self.eval_task: asyncio.Task | None = None
        self.eval_blocking = False
        self.last_eval_bucket = 0
        self.last_checkpoint_bucket = 0
        self.last_logged_step = -1
        self.finishing = False  # the last poll: no evaluation is started
        self.failures = RolloutFailures(env)
        self.eval_failures = EvaluationFailures(env)

    # ----------------------------------------------------------------- start
    async def run(self) -> None:
        env = self.env
        env._runtime = self
        self._install_signal_handlers()
        await env.setup()
        self.client = TrajectoryClient(
            env.config.rollout_server_url,
            self.state_dir / "spool",
            timeout_s=env.config.api_timeout_s,
        )
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
        """setup_wandb, register_env and get_server_info (the env's hooks); False if stopped."""
        env, config = self.env, self.env.config
        await self._until_stopped(env.setup_wandb())
        if not self.stopping.is_set():
            await self._until_stopped(env.register_env())
        if env.env_id is None:
            return False
        await env.get_server_info()
        if config.steps_per_eval > 0:
            self.last_eval_bucket = env.curr_step // config.steps_per_eval
            if config.eval_at_start and (env.curr_step == 0 or not evaluated_before(config)):
                if config.total_steps >= config.steps_per_eval:  # the run evaluates at all
                    self.last_eval_bucket = -1  # a baseline first: the curve starts at 0
        if env.checkpoint_interval and env.checkpoint_interval > 0:
            self.last_checkpoint_bucket = env.curr_step // env.checkpoint_interval
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
            now = time.monotonic()
            if self.last_loop_time is not None:
                env.mainloop_timings.append(now - self.last_loop_time)
            self.last_loop_time = now
            stuck = self.failures.every_rollout_refused(self.kept, now)
            if stuck is not None:
                raise NoRolloutFits(stuck)
            delivered_before = self.client.records_delivered
            status = await self._until_stopped(env.get_status())
            if status is None:
                break
            # a group delivered while /status-env was answering may be missing
            # from self_queue_size and is already gone from the spool: count it
            in_transit = self.client.records_delivered - delivered_before
            queued_batches = (
                status["queue_size"] * env.config.group_size / max(1, env.config.batch_size)
            )
            # env_step_checks sees every poll, the last one too (as upstream); but at
            # the end the trainer may already have stopped the engine that an
            # evaluation would wait on, so the last poll runs none
            self.finishing = status["current_step"] + queued_batches >= env.config.total_steps
            await env.env_step_checks()
            if self.finishing:
                logger.info(
                    "trainer step %d + queued work reached total_steps %d; done",
                    status["current_step"],
                    env.config.total_steps,
                )
                break
            budget = self._worker_budget(status, in_transit)
            self._cancel_surplus(budget)
            await self._start_workers(budget)
            if not self.workers and self.client.holds_status:
                # nothing under way and no room: the trainer must take a batch first, so
                # the next status waits for that instead of the poll interval
                self.client.hold_next_status(status["current_step"], POLL_S)
                continue
            pending = set(self.workers) | {asyncio.ensure_future(asyncio.sleep(POLL_S))}
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED, timeout=POLL_S)

    async def step_checks(self) -> None:
        """BaseEnv.env_step_checks' work: evaluations and checkpoints due, then metrics."""
        await self._evaluate_and_checkpoint()
        await self._maybe_log()

    def _worker_budget(self, status: dict[str, Any], in_transit: int) -> int:
        config = self.env.config
        weight = status.get("env_weight", 1.0)
        window = self._offpolicy_window(status)
        allowed_groups = math.floor(window * config.batch_size * weight / config.group_size)
        if window > 0 or window >= config.max_batches_offpolicy:
            # a diluted weight still leaves one group; a window the trainer's
            # max_staleness closed leaves none (but for the liveness rule below)
            allowed_groups = max(1, allowed_groups)
        on_the_way = in_transit + self.client.pending()
        room = allowed_groups - status["self_queue_size"] - on_the_way
        if (status["queue_size"] + on_the_way) * config.group_size < config.batch_size:
            # the queue cannot make a batch, so the trainer waits: whatever the weights
            # say (envs that crashed and registered again dilute them until they time
            # out), keep one worker going, or the run would stall
            room = max(room, 1)
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

    def _offpolicy_window(self, status: dict[str, Any]) -> int:
        """The batches of this env's work allowed in the system: `max_batches_offpolicy`,
        narrowed by the trainer's `max_staleness` from /status-env (admission.py)."""
        config = self.env.config
        bound = status.get("max_staleness")
        if not isinstance(bound, int) or isinstance(bound, bool) or bound < 0:
            return config.max_batches_offpolicy  # upstream's API sends none: no bound
        window = offpolicy_window(
            config.max_batches_offpolicy,
            bound,
            status["current_step"],
            self.client.newest_weight_version,
        )
        if window < config.max_batches_offpolicy and not self.window_narrowed_logged:
            self.window_narrowed_logged = True
            logger.info(
                "the trainer's max_staleness %d narrows this env's off-policy window from "
                "%d to %d batches (trainer step %s, newest weight version sent %s); "
                "logged once",
                bound,
                config.max_batches_offpolicy,
                window,
                status["current_step"],
                self.client.newest_weight_version,
            )
        return window

    def _cancel_surplus(self, budget: int) -> None:
        surplus = len(self.workers) - budget
        for task in list(self.workers)[::-1][: max(0, surplus)]:
            self.backlog.insert(0, self.workers.pop(task))
            task.cancel()
            self.env.stats["workers_cancelled"] += 1

    async def _start_workers(self, budget: int) -> None:
        if self.env.curr_step > 0 or self.workers:  # upstream skips the start-up fill
            self.env.workers_added_list.append(budget - len(self.workers))
        while len(self.workers) < budget and not self.stopping.is_set():
            item = self.backlog.pop(0) if self.backlog else await self.env.get_next_item()
            if item is None:
                return
            task = asyncio.get_running_loop().create_task(self._work(item))
            self.workers[task] = item
            self.running_items[task.get_name()] = {
                "item": item,
                "worker": task,
                "start_time": time.time(),
            }
            task.add_done_callback(self._forget_worker)

    def _forget_worker(self, task: asyncio.Task) -> None:
        self.workers.pop(task, None)
        self.running_items.pop(task.get_name(), None)

    async def _work(self, item: Any) -> None:
        env = self.env
        timeout = env.config.worker_timeout if env.config.worker_timeout > 0 else None
        started = time.monotonic()
        kept = False
        try:
            groups, more = await asyncio.wait_for(env.collect_trajectories(item), timeout)
            groups = await env.postprocess_histories(groups)
            kept = bool(groups)
            await env.handle_send_to_api(groups, item)
            self.backlog.extend(more or [])
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            env.stats["worker_timeouts"] += 1
            logger.warning(
                "rollout of item %r timed out after %ss", item, env.config.worker_timeout
            )
        except Exception as error:
            self.failures.record(item, error)
        finally:
            duration = time.monotonic() - started
            env.task_duration.append(duration)
            env.task_successful.append(int(kept))
            (env.succeeded_task_duration if kept else env.failed_task_duration).append(duration)
            if kept:
                self.kept += 1
                self.last_completed_item = item
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
        if config.steps_per_eval <= 0 or self.finishing:
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
        except Exception as error:
            self.eval_failures.record(self.env.curr_step, error)

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
            self.backlog[:0] = restored
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
                saved = f"{len(self.backlog)} unfinished items saved to "
                shown = short_path(self.backlog_file, MESSAGE_WIDTH - len(saved))
                logger.info("%s%s", saved, shown)
                if Path.cwd() / shown != Path.cwd() / self.backlog_file:  # cut: whole in files
                    state_logger.debug("%s%s", saved, self.backlog_file)
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


def evaluated_before(config: Any) -> bool:
    """The run already holds an evaluation of this environment: a run resumed after its
    baseline needs none, and a fork (which starts at its parent's step, with a history of
    its own) gets its baseline at that step."""
    folder: str | None = getattr(config, "data_dir_to_save_evals", None)
    return folder is not None and os.path.exists(os.path.join(folder, EVAL_HISTORY))
