"""The reward-function framework: base class, registry, legacy wrapper, CombinedReward.

Expected scores are worked out from upstream Atropos's code (atroposlib/envs/reward_fns),
including its quirks: CombinedReward sums the parts' raw scores and "sum" divides by
the parts' weights.
"""

from __future__ import annotations

import re
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from atroposlib.envs.reward_fns import CombinedReward, RewardFunction, registry
from atroposlib.envs.reward_fns.registry import LegacyFunctionWrapper, RewardRegistry


class MetricsLog:
    """Stands in for a wandb run: keeps what `log` receives."""

    def __init__(self) -> None:
        self.entries: list[dict[str, float]] = []

    def log(self, metrics: dict[str, float]) -> None:
        self.entries.append(metrics)


# A user's reward functions, registered the way upstream's poker_holdem environment does.
@registry.register
class SuiteActionMatchReward(RewardFunction):
    """1.0 when the completion names the winner's action, 0.5 for a related one."""

    def __init__(self, related_score: float = 0.5, weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(weight=weight, **kwargs)
        self.related_score = related_score

    def compute(self, completions, winner_action=None, **kwargs):
        if winner_action is None:
            return [0.0] * len(completions)
        action = winner_action.split()[0]
        related = {"bet": "raise", "raise": "bet", "check": "call", "call": "check"}
        scores = []
        for completion in completions:
            text = self.get_content(completion).lower()
            if action in text:
                scores.append(1.0)
            elif related.get(action, "-") in text:
                scores.append(self.related_score)
            else:
                scores.append(0.0)
        return scores


@registry.register
class SuiteBetSizingReward(RewardFunction):
    """1.0 for the winner's bet amount, falling linearly to 0.0 at 50% off."""

    def compute(self, completions, winner_action=None, **kwargs):
        amount = float(winner_action.split()[1])
        scores = []
        for completion in completions:
            numbers = re.findall(r"\d+(?:\.\d+)?", self.get_content(completion))
            if not numbers:
                scores.append(0.0)
                continue
            low, high = sorted((float(numbers[0]), amount))
            scores.append(max(0.0, 1.0 - ((high - low) / low) / 0.5))
        return scores


class SuitePokerCombinedReward(CombinedReward):
    """Like upstream's PokerCombinedReward: skips `super().__init__` and sets attributes."""

    def __init__(self, normalization: str = "sum", weight: float = 1.0) -> None:
        self.normalization = normalization
        self.weight = weight
        self.reward_functions = [
            registry.create({"type": "suiteactionmatch", "weight": 0.6}),
            registry.create("suitebetsizing", weight=0.4),
        ]


def test_user_subclass_is_registered_under_its_class_name_without_reward():
    assert registry.get("suiteactionmatch") is SuiteActionMatchReward
    assert {"suiteactionmatch", "suitebetsizing"} <= set(registry.list_registered())


def test_user_subclass_created_by_name_and_by_dict_config():
    by_name = registry.create("suiteactionmatch", related_score=0.25)
    by_dict = registry.create(
        {"type": "suiteactionmatch", "weight": 2.0, "params": {"related_score": 0.75}}
    )
    completions = ["I raise to 60", "bet 40", "fold"]
    assert by_name(completions, winner_action="bet 50") == [0.25, 1.0, 0.0]
    assert by_dict.weight == 2.0
    assert by_dict(completions, winner_action="bet 50") == [1.5, 2.0, 0.0]


def test_poker_style_combined_reward_without_super_init():
    reward = SuitePokerCombinedReward()
    completions = ["bet 50", "raise 60", "check"]
    # action: 1.0, 0.5, 0.0; sizing: 1.0, 1 - (10/50)/0.5 = 0.6, 0.0; raw sum / (0.6 + 0.4).
    assert reward.compute(completions, winner_action="bet 50") == pytest.approx([2.0, 1.1, 0.0])
    assert reward(completions, winner_action="bet 50") == pytest.approx([2.0, 1.1, 0.0])
    assert reward.name == "combined(suiteactionmatchreward,suitebetsizingreward)"


def test_dict_config_overrides_keyword_defaults_and_params_are_merged():
    reward = registry.create(
        {"type": "format", "weight": 0.5, "params": {"preferred_tags": ["answer"]}}, weight=4
    )
    assert reward.weight == 0.5
    assert reward(["<think>x</think>", "<answer>y</answer>"]) == [0.0, 0.5]
    assert registry.create("format", weight=4)(["<think>x</think>"]) == [4.0]


def test_unknown_name_is_a_clear_import_error():
    with pytest.raises(ImportError, match=r"Unknown reward function 'no_such_reward'.*registered"):
        registry.create("no_such_reward")
    with pytest.raises(ImportError, match="Unknown reward function"):
        registry.get("../format")
    # Machinery modules of the package are not reward functions.
    with pytest.raises(ImportError, match="Unknown reward function 'registry'"):
        registry.get("registry")


def test_bad_configs_are_clear_errors():
    with pytest.raises(ValueError, match="'type'"):
        registry.create({"weight": 1.0})
    with pytest.raises(TypeError, match="string or a dict"):
        registry.create(42)
    with pytest.raises(ValueError, match="unknown normalization 'mean'"):
        CombinedReward(rewards=["format"], normalization="mean")


def test_register_rejects_non_reward_classes():
    local = RewardRegistry()
    with pytest.raises(TypeError, match="not a subclass of RewardFunction"):
        local.register(dict)


def test_register_with_explicit_name_keeps_upstream_alias():
    local = RewardRegistry()

    @local.register(name="length_reward")
    class Length(RewardFunction):
        def compute(self, completions, **kwargs):
            return [float(len(self.get_content(c))) for c in completions]

    # Upstream registers "length_reward" as "length_"; both names work here.
    assert local.get("length_reward") is Length
    assert local.get("length_") is Length
    assert local.create("length_reward", weight=0.5)(["abcd"]) == [2.0]


def test_builtin_names_resolve_to_upstream_classes_in_a_fresh_registry():
    local = RewardRegistry()
    expected = {
        "accuracy": "AccuracyReward",
        "accuracy_reward": "AccuracyReward",
        "format": "FormatReward",
        "r1": "R1Reward",
        "r1_reward": "R1Reward",
        "reasoning_steps": "ReasoningStepsReward",
        "repetition_penalty": "RepetitionPenaltyReward",
        "crossword_format": "CrosswordFormatReward",
        "chandas_meter": "ChandasMeterReward",
        "combined": "CombinedReward",
    }
    for name, class_name in expected.items():
        assert local.get(name).__name__ == class_name, name
    assert local.get("cascading_r1_math").__name__ == "cascading_r1_math_reward"


@pytest.mark.integration
def test_builtin_modules_load_lazily_on_first_use():
    script = (
        "import sys\n"
        "from atroposlib.envs.reward_fns import registry\n"
        "mod = 'atroposlib.envs.reward_fns.reasoning_steps_reward'\n"
        "print(registry.list_registered(), mod in sys.modules)\n"
        "registry.create('reasoning_steps')\n"
        "print(sorted(registry.list_registered()), mod in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    before, after = result.stdout.strip().splitlines()
    assert before == "['combined'] False"
    assert after == "['combined', 'reasoning_steps', 'reasoningsteps'] True"


def test_legacy_function_is_wrapped_and_scalar_results_are_repeated():
    local = RewardRegistry()

    def constant_reward(completions, **kwargs):
        return 0.25

    def echo_reward(completions, bonus=0.0, **kwargs):
        return [len(c) + bonus for c in completions]

    local.register_function("constant", constant_reward)
    local.register_function("echo", echo_reward)
    constant = local.create("constant", weight=2.0)
    assert isinstance(constant, LegacyFunctionWrapper)
    assert constant.name == "constant_reward"
    assert constant(["a", "b", "c"]) == [0.5, 0.5, 0.5]
    # Settings given at creation stay in `config`; call-time keywords reach the function.
    echo = local.create({"type": "echo", "params": {"bonus": 5}})
    assert echo.config == {"bonus": 5}
    assert echo(["ab", "abc"], bonus=1.0) == [3.0, 4.0]


def test_cascading_r1_math_is_created_through_the_legacy_wrapper():
    reward = registry.create("cascading_r1_math", weight=3)
    assert isinstance(reward, LegacyFunctionWrapper)
    # Correct (1.0) plus the 0.5 think-format bonus, times 3.
    assert reward(["<think>x</think>\\boxed{4}"], solution="4") == [4.5]
    # Without a solution the function cannot run: __call__ scores 0.0.
    assert reward(["<think>x</think>\\boxed{4}"]) == [0.0]


def test_call_applies_weight_and_swallows_errors_that_compute_raises():
    class Failing(RewardFunction):
        def compute(self, completions, **kwargs):
            raise RuntimeError("broken scorer")

    failing = Failing(weight=3.0)
    assert failing(["a", "b"]) == [0.0, 0.0]
    with pytest.raises(RuntimeError, match="broken scorer"):
        failing.compute(["a"])


def test_name_defaults_to_lowercased_class_name_unless_given():
    assert registry.create("format").name == "formatreward"
    assert registry.create("format", name="tags").name == "tags"
    assert registry.create("format", extra_setting=1).config == {"extra_setting": 1}


def test_get_content_reads_upstream_completion_shapes():
    get = RewardFunction.get_content
    assert get("plain") == "plain"
    assert get({"role": "assistant", "content": "a"}) == "a"
    assert get({"message": {"role": "assistant", "content": "b"}}) == "b"
    assert get([{"role": "user", "content": "q"}, {"role": "assistant", "content": "c"}]) == "c"
    assert get({"role": "user", "content": "u"}) == ""
    assert get({"content": "no role"}) == ""
    assert get([]) == ""
    assert get(None) == ""


def test_wandb_metrics_are_logged_per_batch():
    log = MetricsLog()
    reward = registry.create("format", weight=0.5)
    reward.set_wandb_logger(log)
    reward(["<think>x</think>", "none", "<answer>y</answer>", "no"])
    assert log.entries == [
        {
            "reward/formatreward/mean_raw": 0.5,
            "reward/formatreward/mean_weighted": 0.25,
            "reward/formatreward/min": 0.0,
            "reward/formatreward/max": 1.0,
        }
    ]


def test_combined_reward_propagates_the_logger_to_its_parts():
    log = MetricsLog()
    combined = CombinedReward(rewards=["format", "reasoning_steps"])
    combined.set_wandb_logger(log)
    assert all(part.wandb_logger is log for part in combined.reward_functions)
    combined(["<think>x</think>"])
    assert [sorted(e)[0] for e in log.entries] == [
        "reward/combined(formatreward,reasoningstepsreward)/max"
    ]


def test_combined_sum_normalisation_divides_raw_sum_by_part_weights():
    combined = CombinedReward(
        rewards=["format", {"type": "reasoning_steps", "weight": 0.5}], normalization="sum"
    )
    # format 1.0 + reasoning 0.5 (three "Step n:"), divided by 1.0 + 0.5.
    scores = combined(["<think>Step 1: a. Step 2: b. Step 3: c.</think>", "nothing"])
    assert scores == pytest.approx([1.0, 0.0])


def test_combined_without_normalisation_ignores_part_weights():
    combined = registry.create(
        {
            "type": "combined",
            "rewards": [
                {"type": "format", "weight": 2.0},
                {"type": "r1", "params": {"format_weight": 1.0}},
            ],
        }
    )
    # "<think>x</think>4": format 1 + r1 (format 1*1.0 + accuracy 1*1.0); "4": 0 + (0 + 1).
    assert combined(["<think>x</think>4", "4"], solution="4") == [3.0, 1.0]


def test_combined_minmax_normalisation_and_its_flat_batch_case():
    combined = CombinedReward(rewards=["format", "r1"], normalization="minmax")
    # Raw totals 2.5, 1.0 and 1.5 rescale to 1, 0 and 1/3.
    scores = combined(["<think>x</think>4", "4", "<think>x</think>5"], solution="4")
    assert scores == pytest.approx([1.0, 0.0, 1 / 3])
    assert combined(["4", "4"], solution="4") == [1.0, 1.0]
    assert combined([]) == []


def test_combined_weight_applies_after_normalisation():
    combined = CombinedReward(rewards=["format", "accuracy"], normalization="sum", weight=3.0)
    scores = combined(["<think>x</think>\\boxed{4}", "\\boxed{4}", "x"], solution="4")
    assert scores == [3.0, 1.5, 0.0]


def test_combined_leaves_out_a_failing_part():
    @registry.register
    class SuiteBrokenReward(RewardFunction):
        def compute(self, completions, **kwargs):
            raise ValueError("nope")

    combined = CombinedReward(rewards=["suitebroken", "format"])
    assert combined(["<answer>1</answer>", "x"]) == [1.0, 0.0]


def test_load_required_functions_reads_upstream_config_fields():
    config = SimpleNamespace(
        datasets=[
            SimpleNamespace(
                dataset_reward_funcs=["format"],
                reward_funcs=None,
                types=[{"reward_funcs": ["reasoning_steps"]}],
            )
        ],
        reward_functions=[{"type": "r1", "weight": 1.0}, "accuracy_reward"],
        reward_funcs=["format"],
    )
    loaded = registry.load_required_functions(config)
    assert loaded == {"format", "reasoning_steps", "r1", "accuracy_reward"}
    assert {"reasoning_steps", "r1", "accuracy_reward"} <= set(registry.list_registered())
    with pytest.raises(ImportError, match="missing_one"):
        registry.load_required_functions(SimpleNamespace(reward_funcs=["missing_one"]))
