"""`process`: `total_steps` rollouts to a jsonl file (and its HTML viewer), no API.

Upstream's rules: the output never truncates an earlier run's file (a free
`name_N.jsonl` is chosen instead), the groups go through `handle_send_to_api`
with sending off, so the env's filters and `add_rollouts_for_wandb` run as in
`serve`, and `wandb_log` is called after each rollout (to wandb when `use_wandb`).
A step is one `collect_trajectories` call that gave something to keep, as
upstream counts it: an env returning a list of groups (one per turn of a game,
say) plays `total_steps` episodes.
Unlike upstream, a failing rollout is counted and logged (`rollout_failures.py`: a
context refusal once, another error once per place it was raised), and the loop gives
up after 10 x total_steps attempts rather than retrying forever.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from atroposlib.envs.rollout_failures import RolloutFailures

logger = logging.getLogger("atroposlib.envs")


class NothingProcessed(RuntimeError):
    """`process` kept no rollout at all: every item failed or was filtered out."""


async def run_process(env: Any) -> Path:
    """The body of `BaseEnv.process_manager`; returns the jsonl path written."""
    from tqdm import tqdm

    from atroposlib.viewer.jsonl2html import generate_html

    await env.setup()
    if env.config.use_wandb:
        await env.setup_wandb()
    out = unused_path(env.config.data_path_to_save_groups)
    env.config.data_path_to_save_groups = str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.touch()
    env.process_mode = True
    env.n_groups_to_process = env.config.total_steps
    env.group_size_to_process = env.config.group_size
    done, written, attempts = 0, 0, 0
    failures = RolloutFailures(env)
    env.curr_step = 0
    with tqdm(total=env.config.total_steps, desc=f"{env.name or type(env).__name__}") as bar:
        while done < env.config.total_steps:
            if attempts >= 10 * env.config.total_steps:
                logger.warning("stopping: %d items gave only %d usable rollouts", attempts, done)
                break
            attempts += 1
            item = await env.get_next_item()
            if item is None:
                break
            try:
                groups, _ = await env.collect_trajectories(item)
                groups = await env.postprocess_histories(groups)
            except Exception as error:
                failures.record(item, error)
                continue
            before = env.stats["groups_sent"]
            await env.handle_send_to_api(
                groups, item, do_send_to_api=False, abort_on_any_max_length_exceeded=False
            )
            added = env.stats["groups_sent"] - before
            if added:
                written += added
                done += 1
                env.curr_step = done
                bar.update(1)
                await env.wandb_log()
    page = generate_html(str(out))
    print(f"wrote {written} groups to {out} and the viewer {page}")
    if not done and env.config.total_steps > 0:
        dropped = {k: v for k, v in env.stats.items() if k.startswith("dropped_")}
        raise NothingProcessed(
            f"no rollout was kept out of {attempts} items ({failures.summary()}, as logged "
            f"above; dropped by the sending rules: {dropped or 'none'})"
        )
    return out


def unused_path(path: str | Path) -> Path:
    """`path`, or else `name_1.ext`, `name_2.ext`...: an earlier run's output is never truncated.

    Only `process` uses it: `serve` appends, so a supervised restart keeps adding
    to the one file of its env.
    """
    original = Path(path)
    candidate, counter = original, 1
    while candidate.exists():
        candidate = original.with_stem(f"{original.stem}_{counter}")
        counter += 1
    if candidate != original:
        logger.info("%s exists; writing groups to %s", original, candidate)
    return candidate
