"""Pick the best of a group of alternatives by a score, with a second score to break ties.

Game environments sample several actions per step but can continue the episode
with only one; they take the highest advantage and, among equals, the shortest
answer. The first of several fully tied alternatives wins, so the choice is
deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["select_best_index"]


def select_best_index(
    primary_scores: Sequence[float | int],
    secondary_scores: Sequence[float | int],
    primary_higher_is_better: bool = True,
    secondary_lower_is_better: bool = True,
) -> int:
    """Index of the best item by ``primary_scores``, ties broken by ``secondary_scores``.

    Raises ValueError when a list is empty or the two differ in length.
    """
    if len(primary_scores) == 0 or len(secondary_scores) == 0:
        raise ValueError("Input score lists cannot be empty.")
    if len(primary_scores) != len(secondary_scores):
        raise ValueError(
            "Primary and secondary score lists must have the same length "
            f"(got {len(primary_scores)} and {len(secondary_scores)})."
        )

    def beats(a: float | int, b: float | int, higher_is_better: bool) -> bool:
        return a > b if higher_is_better else a < b

    best = 0
    for i in range(1, len(primary_scores)):
        primary, best_primary = primary_scores[i], primary_scores[best]
        if beats(primary, best_primary, primary_higher_is_better):
            best = i
        elif primary == best_primary and beats(
            secondary_scores[i], secondary_scores[best], not secondary_lower_is_better
        ):
            best = i
    return best
