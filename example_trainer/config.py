"""`TrainingConfig`: every flag of `atropos-grpo`, in sections (`sections.py`), flat on
the command line and in a launch YAML's `trainer.args` (`atroposlib.utils.sections`)."""

from __future__ import annotations

import argparse

from pydantic import Field, model_validator

from atroposlib.utils.flags import add_model_flags
from atroposlib.utils.sections import SectionedConfig
from atroposlib.weight_sync.modes import LORA_MODES, RESTART_MODES
from example_trainer.sections import (
    HOT_MODE_CHECKPOINT_INTERVAL,
    BatchingSection,
    CheckpointSection,
    EngineSection,
    LoggingSection,
    LoraSection,
    LossSection,
    ModelSection,
    OptimSection,
    ParallelSection,
    WeightSyncSection,
)

__all__ = ["HOT_MODE_CHECKPOINT_INTERVAL", "LAUNCH_CONFIG", "LORA_MODES", "RESTART_MODES"]


class TrainingConfig(SectionedConfig):
    """The trainer's settings, one section per part of the trainer that reads them."""

    model: ModelSection
    lora: LoraSection = Field(default_factory=LoraSection)
    optim: OptimSection = Field(default_factory=OptimSection)
    batching: BatchingSection = Field(default_factory=BatchingSection)
    loss: LossSection = Field(default_factory=LossSection)
    engine: EngineSection = Field(default_factory=EngineSection)
    weight_sync: WeightSyncSection = Field(default_factory=WeightSyncSection)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    parallel: ParallelSection = Field(default_factory=ParallelSection)
    logging: LoggingSection = Field(default_factory=LoggingSection)

    @model_validator(mode="after")
    def _engines(self) -> TrainingConfig:
        if self.engine.num_engines > 1 and self.weight_sync.weight_bridge_mode == "shared_vllm":
            raise ValueError(
                "--weight-bridge-mode shared_vllm shares one copy of the weights with one "
                "vLLM; with --num-engines above 1 use hot_reload"
            )
        return self

    @model_validator(mode="after")
    def _checkpoint_interval(self) -> TrainingConfig:
        """A hot mode's syncs write no checkpoint, so it gets its own interval by default."""
        if self.checkpoint.save_checkpoint_interval is None:
            hot = not self.weight_sync.restarts_engine
            self.checkpoint.save_checkpoint_interval = HOT_MODE_CHECKPOINT_INTERVAL if hot else 0
        return self


def build_parser(description: str = "") -> argparse.ArgumentParser:
    """`atropos-grpo`'s flags: one per field, and --lora-target-modules also as upstream's
    space-separated list (`q_proj v_proj`), which one value per flag would refuse."""
    parser = argparse.ArgumentParser(
        prog="atropos-grpo", description=description, conflict_handler="resolve"
    )
    add_model_flags(parser, TrainingConfig)
    field = LoraSection.model_fields["lora_target_modules"]
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
