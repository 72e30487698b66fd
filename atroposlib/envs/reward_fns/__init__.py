"""Reward functions: score completions, by name or by config, alone or combined.

Importing the package registers only `combined`; the built-in reward modules load when a
name asks for them (see `registry`), so importing this package stays cheap.

    @registry.register
    class LengthReward(RewardFunction):
        def compute(self, completions, **kwargs):
            return [len(self.get_content(c)) / 100 for c in completions]

    reward_fn = registry.create({"type": "length", "weight": 0.5})
    scores = reward_fn(completions)
"""

from .combined_reward import CombinedReward
from .registry import registry
from .reward_function import RewardFunction

__all__ = ["CombinedReward", "RewardFunction", "registry"]
