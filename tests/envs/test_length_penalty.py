"""`length_penalized`: upstream's brevity rule for groups that are all right."""

from atroposlib.envs.scored_data import length_penalized


def test_all_right_groups_lose_score_linearly_past_half_the_limit():
    assert length_penalized([1.0, 1.0, 1.0], [10, 75, 100], 100) == [1.0, 0.5, 0.0]
    assert length_penalized([1.0, 1.0, 1.0], [100, 3072, 4096], 4096) == [1.0, 0.5, 0.0]
    assert length_penalized([1.0, 1.0], [5000, 2048], 4096) == [0.0, 1.0]


def test_other_groups_are_unchanged():
    assert length_penalized([1.0, 0.0], [100, 100], 100) == [1.0, 0.0]
    assert length_penalized([1.0, 0.0], [4000, 10], 4096) == [1.0, 0.0]
    assert length_penalized([0.5, 0.5], [4000, 4000], 4096) == [0.5, 0.5]
    assert length_penalized([], [], 100) == []
    assert length_penalized([1.0], [50], 0) == [1.0]
