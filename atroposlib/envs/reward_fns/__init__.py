"""Reward functions: score completions, by name or by config, alone or combined.

Importing the package registers only `combined`; the built-in reward modules load when a
name asks for them (see `registry`), so importing this package stays cheap.

Environments that grade in their own code read a reply's answer the way the rewards do,
through the helpers exported here (`after_thinking`, `tagged_answer`, `final_integer`);
the underscore modules behind them are private to this package.

    @registry.register
    class LengthReward(RewardFunction):
        def compute(self, completions, **kwargs):
            return [len(self.get_content(c)) / 100 for c in completions]

    reward_fn = registry.create({"type": "length", "weight": 0.5})
    scores = reward_fn(completions)
"""

from ._final_answer import after_thinking, final_integer, tagged_answer
from .combined_reward import CombinedReward
from .registry import registry
from .reward_function import RewardFunction

__all__ = [
    "CombinedReward",
    "RewardFunction",
    "after_thinking",
    "final_integer",
    "registry",
    "tagged_answer",
]
