"""Property and example tests for the dict-based Atropos helpers in `atroposlib.api.utils`."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atroposlib.api.utils import (
    find_groups_summing_to_target,
    grab_batch_with_minimum_allocations,
    grab_exact_from_heterogeneous_queue,
)
from tests.api.helpers import fcfs_greedy

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


# ------------------------------------------------ differential vs. Atropos model
def atropos_find_groups(sizes: list[int], target: int) -> list[int]:
    """Reference model of Atropos's choice: FCFS when exact, else a DP table traced back
    from the newest group, taking a group whenever the rest stays reachable without it."""
    picked = fcfs_greedy(sizes, target)
    if picked is not None:
        return picked
    table = [{0}]
    for s in sizes:
        table.append(table[-1] | {x + s for x in table[-1] if x + s <= target})
    if target not in table[-1]:
        return []
    chosen, left = [], target
    for i in range(len(sizes), 0, -1):
        if sizes[i - 1] <= left and left - sizes[i - 1] in table[i - 1]:
            chosen.append(i - 1)
            left -= sizes[i - 1]
    return sorted(chosen)


def atropos_min_alloc(sizes, envs, batch_size, configs):
    """Reference model of Atropos's grab_batch_with_minimum_allocations (positions or None);
    only called with at least one allocation."""
    allocations = {
        c["registered_id"]: c["min_batch_allocation"]
        for c in configs
        if c.get("connected") and c.get("min_batch_allocation") is not None
    }
    top = max(sizes)
    bins: dict = {}
    packable: dict = {}
    for i, (s, e) in enumerate(zip(sizes, envs, strict=True)):
        if e is None:
            continue
        packable.setdefault(e, [])
        members = bins.setdefault((e, s), [])
        members.append(i)
        if len(members) * s == top:
            packable[e].extend(members)
            bins[(e, s)] = []
    need = {}
    for e, frac in allocations.items():
        n = int(batch_size * frac)
        if n > 0:
            if not packable.get(e):
                return None
            need[e] = n
    if sum(need.values()) > batch_size:
        scale = batch_size / sum(need.values())
        need = {e: max(min(sizes[i] for i in packable[e]), int(n * scale)) for e, n in need.items()}
    chosen, total = [], 0
    for e, n in need.items():
        got = 0
        for i in packable[e]:
            if got >= n:
                break
            if total + sizes[i] <= batch_size:
                chosen.append(i)
                got += sizes[i]
                total += sizes[i]
    pool = sorted(i for e in packable for i in packable[e] if i not in chosen)
    for i in pool:
        if total == batch_size:
            break
        if total + sizes[i] <= batch_size:
            chosen.append(i)
            total += sizes[i]
    return chosen if total == batch_size else None


@SETTINGS
@given(st.lists(st.integers(1, 9), max_size=12), st.integers(0, 30))
def test_find_groups_matches_atropos_model(sizes, target):
    assert find_groups_summing_to_target(make_queue(sizes), target) == atropos_find_groups(
        sizes, target
    )


def test_find_groups_dp_traces_back_from_newest():
    # FCFS takes the 3 and then nothing fits; Atropos's DP traceback keeps the newest pair.
    assert find_groups_summing_to_target(make_queue([3, 2, 2, 2]), 4) == [2, 3]


@SETTINGS
@given(
    pow2_queue(max_groups=16),
    st.lists(st.sampled_from([0, 1, 2, None]), min_size=16, max_size=16),
    st.lists(
        st.tuples(
            st.integers(0, 3),
            st.sampled_from([None, 0.0, 0.1, 0.25, 0.5, 0.75, 1.0]),
            st.booleans(),
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_minimum_allocations_matches_atropos_model(queue_spec, envs, raw_configs):
    sizes, batch_size = queue_spec
    envs = envs[: len(sizes)]
    configs = [env(i, frac, connected) for i, frac, connected in raw_configs]
    queue = make_queue(sizes, envs)
    batch, rest = grab_batch_with_minimum_allocations(queue, batch_size, configs)
    has_allocation = any(c["connected"] and c["min_batch_allocation"] is not None for c in configs)
    if not sizes or not has_allocation:
        expected_batch, _ = grab_exact_from_heterogeneous_queue(queue, batch_size)
        assert tags(batch) == tags(expected_batch)
    else:
        assert tags(batch) == atropos_min_alloc(sizes, envs, batch_size, configs)
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
