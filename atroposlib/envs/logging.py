"""Where environment metrics go: wandb when `use_wandb`, the log otherwise.

wandb runs offline when no API key is configured (never an interactive
prompt), and with `use_wandb=False` it is not even imported.
"""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger("atroposlib.envs")


def _wandb_run(env: Any):
    run = getattr(env, "_wandb_run", None)
    if run is not None:
        return run
    try:
        import wandb
    except ImportError:
        logger.warning("use_wandb is set but wandb is not installed; logging to the console")
        env.config.use_wandb = False
        return None
    mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
    run = wandb.init(
        project=os.environ.get("WANDB_PROJECT", "atropos-environments"),
        name=env.wandb_prepend or env.config.wandb_name or env.name,
        mode=mode,
        config=env.config.model_dump(mode="json"),
        reinit=True,
    )
    env._wandb_run = run
    return run


def log_metrics(env: Any, metrics: dict[str, Any]) -> None:
    if env.config.use_wandb:
        run = _wandb_run(env)
        if run is not None:
            import wandb

            if env.rollouts_for_wandb:
                table = wandb.Table(columns=["text", "score"])
                for group in env.rollouts_for_wandb:
                    for text, score in group:
                        table.add_data(text, score)
                metrics = {**metrics, "train/rollouts": table}
            run.log(metrics, step=env.curr_step)
            return
    shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}
    logger.info("step %d metrics: %s", env.curr_step, shown)
