"""Property and example tests for the dict-based Atropos helpers in `atroposlib.api.utils`."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atroposlib.api.utils import (
    find_groups_summing_to_target,
    grab_batch_with_minimum_allocations,
    grab_exact_from_heterogeneous_queue,
)

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def group(size: int, tag: int = 0, env_id: int | None = None) -> dict[str, Any]:
    return {"tokens": [[tag, i] for i in range(size)], "tag": tag, "env_id": env_id}


def make_queue(sizes: list[int], envs: list[int | None] | None = None) -> list[dict[str, Any]]:
    envs = envs if envs is not None else [0] * len(sizes)
    return [group(size, tag, env) for tag, (size, env) in enumerate(zip(sizes, envs, strict=True))]


def tags(groups: list[dict[str, Any]] | None) -> list[int] | None:
    return None if groups is None else [g["tag"] for g in groups]


def seqs(groups: list[dict[str, Any]]) -> int:
    return sum(len(g["tokens"]) for g in groups)


def env(registered_id: int, fraction: float | None, connected: bool = True) -> dict[str, Any]:
    return {
        "registered_id": registered_id,
        "connected": connected,
        "min_batch_allocation": fraction,
    }


def assert_split(queue, batch, remaining, batch_size: int) -> None:
    """batch: whole groups summing to batch_size; remaining keeps order; together a partition."""
    assert batch is not None
    assert seqs(batch) == batch_size
    ids_in = [id(g) for g in queue]
    ids_batch = [id(g) for g in batch]
    ids_rest = [id(g) for g in remaining]
    assert len(set(ids_batch)) == len(ids_batch)
    assert sorted(ids_batch + ids_rest) == sorted(ids_in)
    order = {i: n for n, i in enumerate(ids_in)}
    assert [order[i] for i in ids_rest] == sorted(order[i] for i in ids_rest)


def complete_pack_sequences(sizes: list[int]) -> int:
    """Sequences that sit in complete packs of max(sizes), counted per size (independent)."""
    if not sizes:
        return 0
    top = max(sizes)
    return sum((sizes.count(s) // (top // s)) * top for s in set(sizes))


@st.composite
def pow2_queue(draw, max_groups: int = 20):
    batch_size = draw(st.sampled_from([4, 8, 16, 32]))
    allowed = [s for s in (1, 2, 4, 8, 16) if batch_size % s == 0]
    sizes = draw(st.lists(st.sampled_from(allowed), max_size=max_groups))
    return sizes, batch_size


# ------------------------------------------------- find_groups_summing_to_target
def test_find_groups_examples():
    assert find_groups_summing_to_target([], 4) == []
    assert find_groups_summing_to_target(make_queue([2, 2, 4]), 4) == [0, 1]
    assert find_groups_summing_to_target(make_queue([3, 2, 2]), 4) == [1, 2]
    assert find_groups_summing_to_target(make_queue([3, 3]), 4) == []
    assert find_groups_summing_to_target(make_queue([8]), 4) == []
    assert find_groups_summing_to_target(make_queue([1, 8, 3]), 4) == [0, 2]


@SETTINGS
@given(st.lists(st.integers(1, 8), max_size=10), st.integers(1, 24))
def test_find_groups_returns_exact_indices_or_empty(sizes, target):
    buffer = make_queue(sizes)
    result = find_groups_summing_to_target(buffer, target)
    sums = {0}
    for s in sizes:
        sums |= {x + s for x in sums}
    if target in sums:
        assert result == sorted(set(result))
        assert sum(sizes[i] for i in result) == target
    else:
        assert result == []


# -------------------------------------------- grab_exact_from_heterogeneous_queue
def test_grab_exact_empty_and_too_few():
    empty: list = []
    batch, rest = grab_exact_from_heterogeneous_queue(empty, 8)
    assert batch is None and rest is empty
    queue = make_queue([2, 2, 2])
    batch, rest = grab_exact_from_heterogeneous_queue(queue, 8)
    assert batch is None and rest is queue


def test_grab_exact_mixed_size_examples():
    queue = make_queue([4, 8, 4])
    batch, rest = grab_exact_from_heterogeneous_queue(queue, 8)
    assert tags(batch) == [1]
    assert tags(rest) == [0, 2]

    queue = make_queue([2, 2, 4])
    batch, rest = grab_exact_from_heterogeneous_queue(queue, 8)
    assert tags(batch) == [0, 1, 2]
    assert rest == []

    # Batch in pack-completion order: the 4 completes before the pair of 2s.
    queue = make_queue([2, 4, 2, 4])
    batch, rest = grab_exact_from_heterogeneous_queue(queue, 8)
    assert tags(batch) == [1, 0, 2]
    assert tags(rest) == [3]

    # Enough sequences but no complete packs: (None, queue).
    queue = make_queue([2, 1, 4, 1])
    batch, rest = grab_exact_from_heterogeneous_queue(queue, 8)
    assert batch is None and rest is queue


@SETTINGS
@given(pow2_queue())
def test_grab_exact_property(queue_spec):
    sizes, batch_size = queue_spec
    queue = make_queue(sizes)
    snapshot = list(queue)
    batch, rest = grab_exact_from_heterogeneous_queue(queue, batch_size)
    assert queue == snapshot, "the input queue was mutated"
    possible = complete_pack_sequences(sizes) >= batch_size
    if not possible:
        assert batch is None
        assert rest is queue
        return
    assert_split(queue, batch, rest, batch_size)
    # The batch is exactly the oldest complete packs, i.e. it equals the packing plan.
    top = max(sizes)
    bins: dict[int, list[int]] = {}
    packs = []
    for i, s in enumerate(sizes):
        bins.setdefault(s, []).append(i)
        if len(bins[s]) * s == top:
            packs.append(bins.pop(s))
    expected = [i for pack in packs[: batch_size // top] for i in pack]
    assert tags(batch) == expected


@SETTINGS
@given(st.sampled_from([1, 2, 4, 8]), st.integers(1, 4), st.integers(0, 10))
def test_grab_exact_single_size_is_fifo(g, multiple, extra):
    batch_size = g * multiple
    queue = make_queue([g] * (multiple + extra))
    batch, rest = grab_exact_from_heterogeneous_queue(queue, batch_size)
    assert tags(batch) == list(range(multiple))
    assert tags(rest) == list(range(multiple, multiple + extra))


def test_grab_exact_matches_atropos_when_max_size_does_not_divide_batch():
    # Atropos: packs of 4 complete as [0,1], [2,3], [4]; running total 2, 4, 6 -> batch [0,1,2].
    queue = make_queue([2, 2, 2, 2, 4])
    batch, rest = grab_exact_from_heterogeneous_queue(queue, 6)
    assert tags(batch) == [0, 1, 2]
    assert tags(rest) == [3, 4]


# ------------------------------------------ grab_batch_with_minimum_allocations
@SETTINGS
@given(
    pow2_queue(max_groups=16),
    st.lists(st.integers(0, 2), min_size=16, max_size=16),
    st.sampled_from(["empty", "none", "disconnected"]),
)
def test_minimum_allocations_without_allocations_equals_grab_exact(queue_spec, envs, kind):
    sizes, batch_size = queue_spec
    queue = make_queue(sizes, envs[: len(sizes)])
    configs = {
        "empty": [],
        "none": [env(0, None), env(1, None), env(2, None)],
        "disconnected": [env(0, 0.5, connected=False), env(1, 0.75, connected=False)],
    }[kind]
    expected_batch, expected_rest = grab_exact_from_heterogeneous_queue(queue, batch_size)
    batch, rest = grab_batch_with_minimum_allocations(queue, batch_size, configs)
    assert tags(batch) == tags(expected_batch)
    assert tags(rest) == tags(expected_rest)


def test_minimum_allocations_reserves_env_share():
    queue = make_queue([2] * 8, [0, 0, 0, 0, 1, 1, 1, 1])
    configs = [env(0, None), env(1, 0.5)]
    batch, rest = grab_batch_with_minimum_allocations(queue, 8, configs)
    assert_split(queue, batch, rest, 8)
    assert sum(len(g["tokens"]) for g in batch if g["env_id"] == 1) >= 4
    assert sorted(tags(batch)) == [0, 1, 4, 5]
    assert tags(rest) == [2, 3, 6, 7]
    # Without the allocation the oldest groups win.
    batch, _ = grab_batch_with_minimum_allocations(queue, 8, [env(0, None), env(1, None)])
    assert tags(batch) == [0, 1, 2, 3]


def test_minimum_allocations_env_with_minimum_but_no_groups():
    queue = make_queue([2] * 8, [0] * 8)
    batch, rest = grab_batch_with_minimum_allocations(queue, 8, [env(0, None), env(1, 0.25)])
    assert batch is None
    assert rest is queue
    # Same env disconnected: its minimum is ignored.
    batch, rest = grab_batch_with_minimum_allocations(
        queue, 8, [env(0, None), env(1, 0.25, connected=False)]
    )
    assert tags(batch) == [0, 1, 2, 3]
    assert tags(rest) == [4, 5, 6, 7]


def test_minimum_allocations_empty_queue_and_zero_minimum():
    assert grab_batch_with_minimum_allocations([], 8, [env(1, 0.5)]) == (None, [])
    queue = make_queue([2] * 4, [0] * 4)
    # floor(8 * 0.1) == 0: no requirement, so a missing env does not block.
    batch, rest = grab_batch_with_minimum_allocations(queue, 8, [env(1, 0.1)])
    assert tags(batch) == [0, 1, 2, 3]
    assert rest == []


@SETTINGS
@given(
    st.sampled_from([1, 2, 4]),
    st.sampled_from([2, 4, 8]),
    st.sampled_from([0.25, 0.5, 0.75, 1.0]),
    st.lists(st.sampled_from([0, 1]), min_size=1, max_size=24),
)
def test_minimum_allocations_property(g, multiple, fraction, envs):
    batch_size = g * multiple
    queue = make_queue([g] * len(envs), envs)
    configs = [env(0, None), env(1, fraction)]
    needed = int(batch_size * fraction)
    batch, rest = grab_batch_with_minimum_allocations(queue, batch_size, configs)
    if (needed > 0 and 1 not in envs) or len(envs) * g < batch_size:
        assert batch is None
        assert rest is queue
        return
    assert_split(queue, batch, rest, batch_size)
    from_env1 = sum(len(grp["tokens"]) for grp in batch if grp["env_id"] == 1)
    assert from_env1 >= min(needed, envs.count(1) * g)


# --------------------------------------------------- frozen answers of upstream Atropos
# Each case below was produced by running upstream Atropos's own function (copied out of
# NousResearch/atropos at commit 296a0bc55760e43b9c0743c052f8d6c2732606d1,
# atroposlib/api/utils.py) on the input shown, with groups built as `make_queue` builds them.
# They are frozen here as literals: nothing in this file recomputes them.

# (sizes, target, upstream's indices)
UPSTREAM_FIND_GROUPS = [
    ([], 4, []),
    ([2, 2, 4], 4, [0, 1]),
    ([4, 2, 2], 4, [0]),
    ([1, 8, 3], 4, [0, 2]),  # first come, first served skips the 8 and keeps going
    ([5, 1, 3], 4, [1, 2]),
    ([3, 3], 4, []),
    ([8], 4, []),  # a group larger than the target
    ([2, 2, 4], 0, []),
    ([3, 2, 2, 2], 4, [2, 3]),  # FCFS takes the 3 and gets stuck; the newest pair is traced
    ([3, 3, 2, 2], 4, [2, 3]),
    ([6, 1, 5, 2, 3], 10, [2, 3, 4]),
    ([7, 2, 2, 3, 3], 10, [1, 2, 3, 4]),
    ([1, 1, 1], 3, [0, 1, 2]),
    ([2, 5, 4, 1], 9, [1, 2]),
]


@pytest.mark.parametrize(("sizes", "target", "expected"), UPSTREAM_FIND_GROUPS)
def test_find_groups_gives_upstreams_answer(sizes, target, expected):
    assert find_groups_summing_to_target(make_queue(sizes), target) == expected


# (case, sizes, env ids, batch_size, [(registered_id, min_batch_allocation, connected)],
#  upstream's batch tags in its order, upstream's remaining tags)
UPSTREAM_MIN_ALLOC = [
    ("empty queue", [], [], 8, [(1, 0.5, True)], None, []),
    ("one env, no minimum", [2] * 6, [0] * 6, 8, [(0, None, True)], [0, 1, 2, 3], [4, 5]),
    ("one env, all of it", [2] * 6, [0] * 6, 8, [(0, 1.0, True)], [0, 1, 2, 3], [4, 5]),
    (
        "env 1 gets half",
        [2] * 8,
        [0, 0, 0, 0, 1, 1, 1, 1],
        8,
        [(0, None, True), (1, 0.5, True)],
        [4, 5, 0, 1],
        [2, 3, 6, 7],
    ),
    (
        "a minimum but nothing queued",
        [2] * 8,
        [0] * 8,
        8,
        [(0, None, True), (1, 0.25, True)],
        None,
        [0, 1, 2, 3, 4, 5, 6, 7],
    ),
    (
        "a disconnected env's minimum is ignored",
        [2] * 8,
        [0] * 8,
        8,
        [(0, None, True), (1, 0.25, False)],
        [0, 1, 2, 3],
        [4, 5, 6, 7],
    ),
    ("a minimum below one sequence", [2] * 4, [0] * 4, 8, [(1, 0.1, True)], [0, 1, 2, 3], []),
    (
        "minimums summing over 1: 0.125 + 1.0",
        [2] * 6,
        [0, 2, 2, 2, 2, 1],
        8,
        [(0, None, True), (1, 0.125, True), (2, 1.0, True)],
        [5, 1, 2, 3],
        [0, 4],
    ),
    (
        "minimums summing over 1: 0.75 + 0.75",
        [2] * 8,
        [0, 1, 0, 1, 0, 1, 0, 1],
        8,
        [(0, 0.75, True), (1, 0.75, True)],
        [0, 2, 1, 3],
        [4, 5, 6, 7],
    ),
    (
        "a group larger than the batch",
        [16, 4, 4, 4, 4],
        [0, 1, 1, 1, 1],
        8,
        [(1, 0.5, True)],
        [1, 2],
        [0, 3, 4],
    ),
    (
        "only a group larger than the batch is packable",
        [16, 4, 4],
        [0, 0, 0],
        8,
        [(0, 0.5, True)],
        None,
        [0, 1, 2],
    ),
    (
        "mixed sizes in one env",
        [2, 4, 2, 4, 2, 2],
        [0, 1, 0, 1, 1, 1],
        8,
        [(0, None, True), (1, 0.5, True)],
        [1, 0, 2],
        [3, 4, 5],
    ),
    (
        "a minimum for an env without a complete pack",
        [4, 2, 4, 4],
        [0, 1, 0, 0],
        8,
        [(1, 0.25, True)],
        None,
        [0, 1, 2, 3],
    ),
    (
        "groups without an env id",
        [2, 2, 2, 2, 2],
        [None, 0, None, 0, 0],
        4,
        [(0, 0.5, True)],
        [1, 3],
        [0, 2, 4],
    ),
    (
        "three envs, two minimums",
        [1, 2, 2, 1, 2, 2, 1, 1],
        [0, 1, 2, 0, 1, 2, 2, 0],
        4,
        [(0, 0.25, True), (2, 0.5, True)],
        [0, 2, 3],
        [1, 4, 5, 6, 7],
    ),
]


@pytest.mark.parametrize(
    ("sizes", "envs", "batch_size", "configs", "expected_batch", "expected_rest"),
    [pytest.param(*case[1:], id=case[0]) for case in UPSTREAM_MIN_ALLOC],
)
def test_minimum_allocations_give_upstreams_answer(
    sizes, envs, batch_size, configs, expected_batch, expected_rest
):
    queue = make_queue(sizes, envs)
    batch, rest = grab_batch_with_minimum_allocations(
        queue, batch_size, [env(i, fraction, connected) for i, fraction, connected in configs]
    )
    assert tags(batch) == expected_batch
    assert tags(rest) == expected_rest
    if batch is None:
        assert rest is queue
    else:
        assert_split(queue, batch, rest, batch_size)


def test_minimum_allocations_oversubscribed_keeps_a_group_for_each_env():
    # int(8 * 0.125) + int(8 * 1.0) = 9 > 8: scaled to int(1 * 8/9) == 0 -> at least one
    # group of env 1, and int(8 * 8/9) == 7 for env 2.
    queue = make_queue([2] * 6, [0, 2, 2, 2, 2, 1])
    configs = [env(0, None), env(1, 0.125), env(2, 1.0)]
    batch, rest = grab_batch_with_minimum_allocations(queue, 8, configs)
    assert tags(batch) == [5, 1, 2, 3]
    assert tags(rest) == [0, 4]
