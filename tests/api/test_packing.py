"""Property and example tests for `atroposlib.api.packing` (batch planning over sizes)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atroposlib.api.packing import (
    FALLBACK_WINDOW,
    find_subset_summing_to,
    iter_packs,
    plan_batch,
    take_packs,
)

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------- oracles
def reachable_sums(sizes: list[int]) -> set[int]:
    """All sums of sub-multisets of `sizes` (plain set DP, independent of the library)."""
    sums = {0}
    for size in sizes:
        sums |= {s + size for s in sums}
    return sums


def exact_subset_exists(sizes: list[int], target: int) -> bool:
    return target in reachable_sums(sizes)


def brute_force_subsets(sizes: list[int], target: int) -> list[tuple[int, ...]]:
    """Every ascending tuple of positions whose sizes sum to target (small inputs only)."""
    found = []
    for r in range(1, len(sizes) + 1):
        for combo in itertools.combinations(range(len(sizes)), r):
            if sum(sizes[p] for p in combo) == target:
                found.append(combo)
    return found


def assert_valid_batch(positions: list[int], sizes: list[int], batch_size: int) -> None:
    assert positions, "a batch must hold at least one group"
    assert positions == sorted(positions), f"positions not ascending: {positions}"
    assert len(set(positions)) == len(positions), f"duplicate positions: {positions}"
    assert all(0 <= p < len(sizes) for p in positions), f"out of range: {positions}"
    assert sum(sizes[p] for p in positions) == batch_size


# --------------------------------------------------------------- strategies
POW2 = [1, 2, 4, 8, 16]


@st.composite
def pow2_queue(draw, max_groups: int = 24):
    """(sizes, batch_size): power-of-two sizes that all divide batch_size."""
    batch_size = draw(st.sampled_from([4, 8, 16, 32]))
    allowed = [s for s in POW2 if batch_size % s == 0]
    sizes = draw(st.lists(st.sampled_from(allowed), min_size=0, max_size=max_groups))
    return sizes, batch_size


@st.composite
def any_queue(draw, max_groups: int = 12):
    """(sizes, batch_size) with arbitrary positive sizes (outside the power-of-two contract)."""
    sizes = draw(st.lists(st.integers(1, 9), min_size=0, max_size=max_groups))
    batch_size = draw(st.integers(1, 24))
    return sizes, batch_size


# ------------------------------------------------------------- plan_batch
@SETTINGS
@given(st.one_of(pow2_queue(max_groups=12), any_queue(max_groups=12)))
def test_plan_batch_returns_batch_iff_exact_subset_exists(queue):
    sizes, batch_size = queue
    env_ids = [0] * len(sizes)
    positions = plan_batch(sizes, env_ids, batch_size)
    exists = exact_subset_exists(sizes, batch_size)
    if exists:
        assert positions is not None, f"missed an exact batch in {sizes} for {batch_size}"
        assert_valid_batch(positions, sizes, batch_size)
    else:
        assert positions is None


@SETTINGS
@given(pow2_queue(max_groups=30), st.lists(st.integers(0, 2), min_size=30, max_size=30))
def test_plan_batch_result_is_exact_whole_groups(queue, envs):
    sizes, batch_size = queue
    positions = plan_batch(sizes, envs[: len(sizes)], batch_size)
    if positions is not None:
        assert_valid_batch(positions, sizes, batch_size)
    if sum(sizes) < batch_size:
        assert positions is None


@SETTINGS
@given(st.lists(st.integers(1, 8), max_size=10), st.integers(1, 40))
def test_plan_batch_none_when_total_below_batch_size(sizes, extra):
    batch_size = sum(sizes) + extra
    assert plan_batch(sizes, [0] * len(sizes), batch_size) is None


@SETTINGS
@given(
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([1, 2, 4, 8]),
    st.integers(0, 20),
    st.lists(st.integers(0, 3), min_size=40, max_size=40),
)
def test_plan_batch_single_size_is_oldest_first(g, multiple, extra, envs):
    batch_size = g * multiple
    count = multiple + extra
    sizes = [g] * count
    positions = plan_batch(sizes, envs[:count], batch_size)
    assert positions == list(range(batch_size // g))


# Worked by hand with the pack rule (groups of one size gather into packs as large as the
# largest group queued; a batch is the oldest complete packs, in the order they complete).
PACK_RULE_CASES = [
    # packs of 4: [0] then [1, 2] (two 2s) then [3]; a batch of 8 is the first two packs
    ([4, 2, 2, 4], 8, [0, 1, 2]),
    # packs of 4: the 2s at 0 and 2 complete after the 4 at 1
    ([2, 4, 2, 4], 8, [0, 1, 2]),
    # packs of 8: [1], then the four 2s at 0, 2, 3, 4; a batch of 8 is the 8 alone
    ([2, 8, 2, 2, 2, 4], 8, [1]),
    # packs of 8: [1] completes first, then [0, 2, 3, 4]; the 4 at 5 never completes a pack
    ([2, 8, 2, 2, 2, 4], 16, [0, 1, 2, 3, 4]),
    # packs of 4: four 1s complete at 3, the 4 at 4, two 2s at 6; batch of 8: first two packs
    ([1, 1, 1, 1, 4, 2, 2], 8, [0, 1, 2, 3, 4]),
    # packs of 4: the 2 at 0 waits for the 2 at 3; the 4s at 1 and 2 come first
    ([2, 4, 4, 2], 8, [1, 2]),
    # packs of 16: the 16 at 2 is the only complete pack
    ([8, 4, 16, 8], 16, [2]),
    # packs of 16: the 8s at 0 and 3 complete the first pack
    ([8, 4, 4, 8, 16], 16, [0, 3]),
    # all groups of one size: the oldest ones
    ([2, 2, 2, 2, 2], 4, [0, 1]),
]


@pytest.mark.parametrize(("sizes", "batch_size", "expected"), PACK_RULE_CASES)
def test_plan_batch_takes_the_oldest_complete_packs(sizes, batch_size, expected):
    assert plan_batch(sizes, [0] * len(sizes), batch_size) == expected


def drain(sizes: list[int], batch_size: int, envs: list[int] | None = None):
    queue = [(tag, size) for tag, size in enumerate(sizes)]
    env_of = envs or [0] * len(sizes)
    batches = []
    for _ in range(len(sizes) + 1):
        positions = plan_batch([s for _, s in queue], [env_of[t] for t, _ in queue], batch_size)
        if positions is None:
            break
        assert_valid_batch(positions, [s for _, s in queue], batch_size)
        batches.append([queue[p][0] for p in positions])
        chosen = set(positions)
        queue = [item for i, item in enumerate(queue) if i not in chosen]
    else:
        pytest.fail("plan_batch kept returning batches from a finite queue")
    return batches, queue


@SETTINGS
@given(st.one_of(pow2_queue(max_groups=20), any_queue(max_groups=16)))
def test_draining_serves_each_group_once_and_leaves_no_exact_batch(queue):
    sizes, batch_size = queue
    batches, leftover = drain(sizes, batch_size)
    served = [tag for batch in batches for tag in batch]
    assert len(served) == len(set(served)), "a group was served twice"
    for batch in batches:
        assert sum(sizes[tag] for tag in batch) == batch_size
    leftover_tags = [tag for tag, _ in leftover]
    assert leftover_tags == sorted(leftover_tags), "leftover lost its FIFO order"
    assert sorted(served + leftover_tags) == list(range(len(sizes)))
    leftover_sizes = [size for _, size in leftover]
    assert sum(leftover_sizes) < batch_size or not exact_subset_exists(leftover_sizes, batch_size)
    # Everything was served when the whole queue is a multiple of batch_size of equal groups.
    if sizes and len(set(sizes)) == 1 and batch_size % sizes[0] == 0:
        assert sum(leftover_sizes) < batch_size


def test_plan_batch_fallback_when_packs_cannot_fill():
    # Packs of 8: [0,3] (2+2 incomplete), the 4 alone is incomplete, the 8 completes:
    # the pack rule has only 8 complete sequences but 2+4+8+2 is exact.
    sizes = [2, 4, 8, 2]
    assert plan_batch(sizes, [0] * 4, 16) == [0, 1, 2, 3]


def test_plan_batch_mixed_sizes_examples():
    # The 8 completes a pack before the two 4s do.
    assert plan_batch([4, 8, 4], [0, 0, 0], 8) == [1]
    assert plan_batch([2, 2, 4], [0, 0, 0], 8) == [0, 1, 2]
    assert plan_batch([4, 4, 4], [0, 0, 0], 8) == [0, 1]
    assert plan_batch([3, 3], [0, 0], 4) is None
    assert plan_batch([], [], 4) is None
    assert plan_batch([4], [0], 0) is None


def test_plan_batch_fallback_respects_window():
    # Beyond FALLBACK_WINDOW groups the exact-subset fallback does not look.
    sizes = [3] * FALLBACK_WINDOW + [1]
    assert plan_batch(sizes, [0] * len(sizes), 4) is None
    sizes = [3] * (FALLBACK_WINDOW - 1) + [1]
    assert plan_batch(sizes, [0] * len(sizes), 4) == [0, FALLBACK_WINDOW - 1]


# ------------------------------------------------------ min allocations
@SETTINGS
@given(
    st.sampled_from([1, 2, 4]),
    st.sampled_from([2, 4, 8]),
    st.data(),
)
def test_min_sequences_reserves_env_share(g, multiple, data):
    batch_size = g * multiple
    m = g * data.draw(st.integers(1, multiple), label="min packs")
    envs = data.draw(st.lists(st.sampled_from([0, 1]), min_size=1, max_size=3 * multiple))
    # Env 1 (A) holds at least m sequences; the whole queue holds at least batch_size.
    a_needed = m // g - envs.count(1)
    envs = envs + [1] * max(0, a_needed)
    envs = envs + [0] * max(0, multiple - len(envs))
    envs = data.draw(st.permutations(envs), label="order")
    sizes = [g] * len(envs)
    positions = plan_batch(sizes, envs, batch_size, {1: m / batch_size, 0: 0.0})
    assert positions is not None
    assert_valid_batch(positions, sizes, batch_size)
    from_a = sum(sizes[p] for p in positions if envs[p] == 1)
    assert from_a >= m
    # A gets only its share (rounded up to whole groups); the rest is oldest first.
    a_positions = [p for p in positions if envs[p] == 1]
    assert a_positions[: m // g] == [p for p, e in enumerate(envs) if e == 1][: m // g]
    others = [p for p in range(len(envs)) if p not in set(a_positions[: m // g])]
    assert sorted(set(positions) - set(a_positions[: m // g])) == others[: multiple - m // g]


@SETTINGS
@given(pow2_queue(max_groups=12), st.data())
def test_min_allocations_give_an_exact_batch_or_none(queue, data):
    sizes, batch_size = queue
    envs = data.draw(st.lists(st.integers(0, 2), min_size=len(sizes), max_size=len(sizes)))
    shares = data.draw(
        st.dictionaries(st.integers(0, 3), st.sampled_from([0.0, 0.25, 0.5, 1.0]), max_size=3)
    )
    positions = plan_batch(sizes, envs, batch_size, shares)
    if positions is not None:
        assert_valid_batch(positions, sizes, batch_size)
    if not exact_subset_exists(sizes, batch_size):
        assert positions is None
    if any(share > 0 and env not in envs for env, share in shares.items()):
        assert positions is None  # a guarantee: no batch without that env's share


def test_min_allocation_example_env_reserved_from_back_of_queue():
    sizes = [2] * 8
    envs = [0, 0, 0, 0, 1, 1, 1, 1]
    assert plan_batch(sizes, envs, 8) == [0, 1, 2, 3]
    assert plan_batch(sizes, envs, 8, {1: 0.5}) == [0, 1, 4, 5]
    assert plan_batch(sizes, envs, 8, {1: 0.375}) == [0, 1, 4, 5]  # 3 sequences: two groups
    assert plan_batch(sizes, envs, 8, {1: 1.0}) == [4, 5, 6, 7]
    # An env with a minimum but nothing queued blocks the batch, as upstream's does.
    assert plan_batch(sizes, envs, 8, {2: 0.5}) is None


# ------------------------------------------------------- take_packs / iter
def test_iter_packs_completion_order_and_keys():
    sizes = [2, 4, 2, 4, 1, 1, 1, 1]
    assert list(iter_packs(sizes, 4)) == [[1], [0, 2], [3], [4, 5, 6, 7]]
    keys = [0, 0, 1, 1, 0, 1, 0, 1]
    assert list(iter_packs(sizes, 4, keys=keys)) == [[1], [3]]
    assert take_packs(iter_packs(sizes, 4), sizes, 8) == [1, 0, 2]
    # A size that does not divide the pack size never completes a pack.
    assert list(iter_packs([3, 4, 3, 3], 4)) == [[1]]
    assert take_packs(iter_packs([4, 4], 4), [4, 4], 6) is None
    assert take_packs(iter_packs([4], 4), [4], 8) is None


# ------------------------------------------------- find_subset_summing_to
@SETTINGS
@given(st.lists(st.integers(1, 10), max_size=10), st.integers(0, 40))
def test_find_subset_exists_iff_brute_force(sizes, target):
    result = find_subset_summing_to(sizes, target)
    subsets = brute_force_subsets(sizes, target) if target > 0 else []
    if subsets:
        assert result, f"missed a subset of {sizes} summing to {target}"
        assert tuple(result) in subsets
        assert result == sorted(set(result))
    else:
        assert result == []


# Worked by hand: first come, first served (take each group that still fits) when that lands
# exactly on the target; otherwise some other exact combination.
FCFS_CASES = [
    ([1, 2, 3, 4], 6, [0, 1, 2]),  # 1 + 2 + 3
    ([4, 3, 2, 1], 6, [0, 2]),  # 4; 3 does not fit (7); 2 lands on 6
    ([5, 4, 1], 6, [0, 2]),  # 5, 4 does not fit, then 1
    ([10, 3, 3], 6, [1, 2]),  # the 10 never fits
    ([2, 2, 2, 2], 8, [0, 1, 2, 3]),
    ([7], 7, [0]),
]
NOT_FCFS_CASES = [
    # FCFS takes 3 and 2 (5), then neither 2 nor 4 fits; 2 + 4 is exact
    ([3, 2, 2, 4], 6),
    # FCFS takes 4 and 1 (5), then neither 2 nor 3 fits; 4 + 2 and 1 + 2 + 3 are exact
    ([4, 1, 2, 3], 6),
    # FCFS takes 5 and cannot add a 3; 3 + 3 is exact
    ([5, 3, 3], 6),
]


@pytest.mark.parametrize(("sizes", "target", "expected"), FCFS_CASES)
def test_find_subset_takes_the_first_come_first_served_pick(sizes, target, expected):
    assert find_subset_summing_to(sizes, target) == expected


@pytest.mark.parametrize(("sizes", "target"), NOT_FCFS_CASES)
def test_find_subset_finds_another_exact_pick_when_fcfs_misses(sizes, target):
    result = find_subset_summing_to(sizes, target)
    assert result == sorted(set(result)) and sum(sizes[p] for p in result) == target


def test_find_subset_examples():
    assert find_subset_summing_to([], 4) == []
    assert find_subset_summing_to([2, 2, 4], 0) == []
    assert find_subset_summing_to([2, 2, 4], 4) == [0, 1]
    assert find_subset_summing_to([4, 2, 2], 4) == [0]
    assert find_subset_summing_to([3, 2, 2], 4) == [1, 2]
    assert find_subset_summing_to([3, 3, 3], 4) == []
    assert find_subset_summing_to([5, 1, 3], 4) == [1, 2]
    # Skips groups that do not fit, then keeps going (not a strict prefix).
    assert find_subset_summing_to([1, 8, 3], 4) == [0, 2]


def test_min_sequences_oversubscribed_keeps_a_pack_for_each_env():
    # 1 + 100 > 8: scaled down to 8 * 1 // 101 == 0 and 800 // 101 == 7, but every env with a
    # minimum still gets at least one pack.
    sizes = [4, 4, 4, 4]
    envs = [0, 2, 2, 1]
    assert plan_batch(sizes, envs, 8, {1: 1, 2: 100}) == [1, 3]
    assert plan_batch(sizes, envs, 8, {2: 100}) == [1, 2]


def test_a_minimum_allocation_is_a_guarantee_as_upstream():
    """A3: env 0 must get half of every batch; while it has nothing queued, no batch."""
    assert plan_batch([4, 4], [1, 1], 8) == [0, 1]
    assert plan_batch([4, 4], [1, 1], 8, {0: 0.5}) is None
    assert plan_batch([4, 4, 4], [1, 1, 0], 8, {0: 0.5}) == [0, 2]
    # env 0's groups of 2 fill its 4 sequences before the oldest pack of env 1
    assert plan_batch([4, 2, 4, 2], [1, 0, 1, 0], 8, {0: 0.5}) == [0, 1, 3]
