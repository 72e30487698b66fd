"""select_best_index as upstream's blackjack environment calls it: advantages first, then length."""

from __future__ import annotations

import math

import numpy as np
import pytest

from atroposlib.utils.best_of_n_selection import select_best_index


def test_highest_advantage_wins():
    assert select_best_index([0.1, 0.9, -0.5], [10, 50, 1]) == 1


def test_tie_goes_to_the_shortest():
    advantages = [0.5, 1.0, 1.0, 1.0, -1.0]
    token_lengths = [3, 40, 12, 25, 1]
    assert (
        select_best_index(
            primary_scores=advantages,
            secondary_scores=token_lengths,
            primary_higher_is_better=True,
            secondary_lower_is_better=True,
        )
        == 2
    )


def test_full_tie_keeps_the_first():
    assert select_best_index([1, 1, 1], [5, 5, 5]) == 0
    assert select_best_index([1, 2, 2], [5, 7, 7]) == 1


def test_directions_can_be_flipped():
    primary = [3.0, 1.0, 1.0, 2.0]
    secondary = [0, 4, 9, 0]
    assert select_best_index(primary, secondary, primary_higher_is_better=False) == 1
    assert (
        select_best_index(
            primary, secondary, primary_higher_is_better=False, secondary_lower_is_better=False
        )
        == 2
    )
    assert select_best_index([1, 1], [2, 8], secondary_lower_is_better=False) == 1


def test_ints_floats_and_numpy_arrays():
    assert select_best_index(np.array([0.0, 2.5, 2]), np.array([1, 1, 0])) == 1
    assert select_best_index([2, 2.0], [9, 3]) == 1


def test_nan_never_replaces_the_current_best():
    assert select_best_index([0.2, math.nan, 0.1], [1, 0, 0]) == 0


def test_single_item():
    assert select_best_index([-4], [0]) == 0


@pytest.mark.parametrize(
    ("primary", "secondary", "message"),
    [([], [], "empty"), ([1.0], [], "empty"), ([1.0, 2.0], [1], "same length")],
)
def test_bad_lists_raise(primary, secondary, message):
    with pytest.raises(ValueError, match=message):
        select_best_index(primary, secondary)
