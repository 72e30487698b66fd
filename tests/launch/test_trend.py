"""The line the agent's learning test judges a run by (tests/support/launch.py `trend`)."""

from __future__ import annotations

import math
import random
import statistics

from tests.support.launch import trend


def test_the_rise_is_the_least_squares_lines_and_t_its_slope_over_the_standard_error():
    scores = [0.3, 0.2, 0.5, 0.4, 0.6, 0.5]
    rise, t = trend(scores)
    fitted = statistics.linear_regression(range(len(scores)), scores)
    assert math.isclose(rise, fitted.slope * 5)
    # the slope's standard error by the textbook formula, from the residuals
    residuals = [s - fitted.intercept - fitted.slope * x for x, s in enumerate(scores)]
    spread = sum((x - 2.5) ** 2 for x in range(6))
    error = math.sqrt(sum(r * r for r in residuals) / 4 / spread)
    assert math.isclose(t, fitted.slope / error)


def test_a_flat_run_is_rarely_four_standard_errors_up_and_a_clean_line_far_beyond():
    draws = random.Random(0)
    flat = [trend([draws.gauss(0.4, 0.07) for _ in range(45)])[1] for _ in range(2000)]
    assert sum(t > 4 for t in flat) <= 2  # about 1 in 10,000 by the t distribution
    rise, t = trend([0.1 * step for step in range(10)])
    assert math.isclose(rise, 0.9) and t > 1e12
    assert trend([0.5] * 10) == (0.0, 0.0)
