import math

import numpy as np
import pytest

from atroposlib.utils.advantages import (
    allclose_to_first,
    compute_discounted_returns,
    compute_grpo_process_supervision_advantages,
    compute_stats,
)

# --- allclose_to_first ---


def test_allclose_to_first_all_close():
    values = [np.array([1.0, 2.0]), np.array([1.0, 2.0 + 1e-9]), [1.0, 2.0]]
    assert allclose_to_first(values) is True


def test_allclose_to_first_one_differs():
    values = [np.array([1.0, 2.0]), np.array([1.0, 2.0]), np.array([1.0, 2.1])]
    assert allclose_to_first(values) is False


def test_allclose_to_first_tolerances():
    values = [np.array([1.0]), np.array([1.05])]
    assert allclose_to_first(values) is False
    assert allclose_to_first(values, atol=0.1) is True
    assert allclose_to_first(values, rtol=0.1) is True


def test_allclose_to_first_equal_nan():
    values = [np.array([1.0, np.nan]), np.array([1.0, np.nan])]
    assert allclose_to_first(values) is False
    assert allclose_to_first(values, equal_nan=True) is True


def test_allclose_to_first_return_vector():
    values = [np.array([0.0, 1.0]), np.array([0.0, 1.0]), np.array([5.0, 1.0]), [0.0, 1.0]]
    flags = allclose_to_first(values, return_vector=True)
    assert isinstance(flags, np.ndarray) and flags.dtype == np.bool_
    assert flags.tolist() == [True, True, False, True]


def test_allclose_to_first_scalars_vector():
    flags = allclose_to_first([1.0, 1.000000001, 1.1], return_vector=True)
    assert isinstance(flags, np.ndarray)
    assert flags.tolist() == [True, True, False]


def test_allclose_to_first_ragged_is_a_clear_error():
    with pytest.raises(ValueError, match="rectangular"):
        allclose_to_first([[1.0, 2.0], [1.0]])


def test_allclose_to_first_2d_array_rows():
    values = np.array([[1.0, 2.0], [1.0, 2.0], [3.0, 2.0]])
    assert allclose_to_first(values, return_vector=True).tolist() == [True, True, False]
    assert allclose_to_first(values) is False


def test_allclose_to_first_empty():
    assert allclose_to_first([]) is True
    empty = allclose_to_first([], return_vector=True)
    assert isinstance(empty, np.ndarray) and empty.shape == (0,)


# --- compute_stats ---


def test_compute_stats_jagged():
    stats = compute_stats([[1, 2], [3, 4, 5]])
    assert stats == {"mean": 3.0, "var": 2.0}
    assert isinstance(stats["mean"], float) and isinstance(stats["var"], float)


def test_compute_stats_deeply_nested():
    # numbers 1, 2, 3, 4: mean 2.5, var = (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25
    stats = compute_stats([[[1], [2, 3]], [4]])
    assert stats["mean"] == pytest.approx(2.5)
    assert stats["var"] == pytest.approx(1.25)


def test_compute_stats_small_jagged():
    # numbers 1, 2, 3: mean 2, var = (1 + 0 + 1) / 3
    stats = compute_stats([[1, 2], [3]])
    assert stats["mean"] == pytest.approx(2.0)
    assert stats["var"] == pytest.approx(2 / 3)


def test_compute_stats_empty_raises():
    with pytest.raises(ValueError):
        compute_stats([[], []])


# --- compute_discounted_returns ---


def test_discounted_returns_half():
    out = compute_discounted_returns([1, 1, 1], 0.5)
    assert isinstance(out, np.ndarray)
    assert out.dtype == np.float32  # a list gives float32, as upstream
    np.testing.assert_allclose(out, [1.75, 1.5, 1.0])


def test_discounted_returns_dtype_follows_array():
    assert compute_discounted_returns(np.array([1.0, 2.0]), 0.5).dtype == np.float64
    assert compute_discounted_returns(np.array([1.0], dtype=np.float32), 0.5).dtype == np.float32
    ints = compute_discounted_returns(np.array([1, 1]), 0.5)
    assert ints.dtype == np.float64  # not truncated to integers
    np.testing.assert_allclose(ints, [1.5, 1.0])


def test_discounted_returns_gamma_one_and_zero():
    rewards = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(compute_discounted_returns(rewards, 1.0), [6.0, 5.0, 3.0])
    np.testing.assert_allclose(compute_discounted_returns(rewards, 0.0), [1.0, 2.0, 3.0])


def test_discounted_returns_empty():
    out = compute_discounted_returns([], 0.9)
    assert out.shape == (0,)


# --- compute_grpo_process_supervision_advantages ---
# rewards [[1, 2], [3, 4, 5]]: global mean 3, population std sqrt(2)
# normalised: [-2, -1] / s and [0, 1, 2] / s with s = sqrt(2)
S = math.sqrt(2.0)


def test_process_supervision_reverse_cumsum():
    out = compute_grpo_process_supervision_advantages([[1, 2], [3, 4, 5]])
    assert isinstance(out, list) and len(out) == 2
    assert all(isinstance(a, np.ndarray) for a in out)
    np.testing.assert_allclose(out[0], [-3.0 / S, -1.0 / S])
    np.testing.assert_allclose(out[1], [3.0 / S, 3.0 / S, 2.0 / S])


def test_process_supervision_discounted():
    out = compute_grpo_process_supervision_advantages([[1, 2], [3, 4, 5]], gamma=0.5)
    # traj 1: G1 = -1/s, G0 = -2/s + 0.5 * (-1/s) = -2.5/s
    np.testing.assert_allclose(out[0], [-2.5 / S, -1.0 / S])
    # traj 2: G2 = 2/s, G1 = 1/s + 0.5 * 2/s = 2/s, G0 = 0 + 0.5 * 2/s = 1/s
    np.testing.assert_allclose(out[1], [1.0 / S, 2.0 / S, 2.0 / S])


def test_process_supervision_unit_std():
    # values 0, 2, 0, 2: mean 1, std 1 -> normalised [-1, 1], [-1, 1]
    out = compute_grpo_process_supervision_advantages([[0, 2], [0, 2]])
    np.testing.assert_allclose(out[0], [0.0, 1.0])
    np.testing.assert_allclose(out[1], [0.0, 1.0])


def test_process_supervision_constant_rewards_raise():
    with pytest.raises(ValueError, match="std"):
        compute_grpo_process_supervision_advantages([[1.0, 1.0], [1.0]])


def test_process_supervision_std_tol():
    rewards = [[0.0, 2.0]]  # std 1
    with pytest.raises(ValueError):
        compute_grpo_process_supervision_advantages(rewards, std_tol=2.0)
    out = compute_grpo_process_supervision_advantages(rewards, std_tol=0.5)
    np.testing.assert_allclose(out[0], [0.0, 1.0])
