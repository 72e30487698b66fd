"""Batch assembly: pick whole groups whose sequence counts sum exactly to batch_size.

The rules are Atropos's (PROTOCOL.md, "Queue and batch semantics"):
groups of a common size are gathered into *packs* as large as the largest group
queued, and a batch is made of whole packs, oldest first. Packs keep mixed sizes
from fragmenting a batch.

These functions work on sizes and env ids only, never on group bodies, so the
server can plan a batch over a 10,000-group queue in well under a millisecond
and fetch the chosen bodies afterwards. The scan stops as soon as the batch is
full. When the pack rule cannot fill a batch although an exact combination of
whole groups exists (e.g. sizes 2, 4, 8, 2 for a batch of 16), the server falls
back to that combination instead of stalling as Atropos does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

# The exact-subset fallback looks at this many of the oldest groups at most.
FALLBACK_WINDOW = 4096


def iter_packs(
    sizes: Sequence[int], pack_size: int, keys: Sequence | None = None
) -> Iterator[list[int]]:
    """Yield packs (lists of positions) in the order they complete.

    Groups are binned by size (and by `keys[i]` when given, e.g. the env id); a bin
    becomes a pack the moment its sizes add up to exactly `pack_size`.
    """
    bins: dict[tuple, list[int]] = {}
    for position, size in enumerate(sizes):
        bin_key = (size, keys[position]) if keys is not None else (size,)
        members = bins.setdefault(bin_key, [])
        members.append(position)
        if len(members) * size == pack_size:
            yield members
            bins[bin_key] = []


def take_packs(
    packs: Iterator[list[int]], sizes: Sequence[int], batch_size: int
) -> list[int] | None:
    """Positions, in pack order, of the first groups that add up to exactly batch_size.

    Groups are taken one at a time, so a batch may end inside a pack when the pack
    size does not divide batch_size (as in Atropos); overshooting means no batch.
    """
    chosen: list[int] = []
    total = 0
    for pack in packs:
        for position in pack:
            chosen.append(position)
            total += sizes[position]
            if total == batch_size:
                return chosen
            if total > batch_size:
                return None
    return None


def find_subset_summing_to(sizes: Sequence[int], target: int) -> list[int]:
    """Ascending positions whose sizes sum to `target`; [] when impossible.

    First come, first served when that lands exactly; otherwise any exact
    combination, found with a bitset subset-sum and traced back from the newest
    group (the same choice as Atropos's `find_groups_summing_to_target`).
    """
    if not sizes or target <= 0:
        return []
    picked: list[int] = []
    running = 0
    for position, size in enumerate(sizes):
        if running + size <= target:
            picked.append(position)
            running += size
            if running == target:
                return picked
    mask = (1 << (target + 1)) - 1
    reachable = [1]  # reachable[i]: bitset of sums reachable with the first i groups
    for size in sizes:
        previous = reachable[-1]
        reachable.append((previous | (previous << size)) & mask)
    if not (reachable[-1] >> target) & 1:
        return []
    picked = []
    remaining = target
    for i in range(len(sizes), 0, -1):
        size = sizes[i - 1]
        if size <= remaining and (reachable[i - 1] >> (remaining - size)) & 1:
            picked.append(i - 1)
            remaining -= size
    return sorted(picked)


def plan_batch(
    sizes: Sequence[int],
    env_ids: Sequence[int | None],
    batch_size: int,
    min_sequences: dict[int, int] | None = None,
) -> list[int] | None:
    """Positions (ascending, i.e. oldest first) of the groups of the next batch, or None.

    `min_sequences` maps env id -> sequences that env must get in the batch when it
    has them queued in complete packs.
    """
    if batch_size <= 0 or sum(sizes) < batch_size:
        return None
    pack_size = max(sizes)
    chosen = None
    if min_sequences:
        chosen = _plan_with_minimums(sizes, env_ids, batch_size, pack_size, min_sequences)
    if chosen is None:
        chosen = take_packs(iter_packs(sizes, pack_size), sizes, batch_size)
    if chosen is None:
        chosen = find_subset_summing_to(sizes[:FALLBACK_WINDOW], batch_size) or None
    return sorted(chosen) if chosen is not None else None


def _plan_with_minimums(
    sizes: Sequence[int],
    env_ids: Sequence[int | None],
    batch_size: int,
    pack_size: int,
    min_sequences: dict[int, int],
) -> list[int] | None:
    """Reserved packs for each env with a minimum first, then the oldest packs of anyone."""
    packs = list(iter_packs(sizes, pack_size, keys=env_ids))
    required = {env: n for env, n in min_sequences.items() if n > 0}
    reserved_total = sum(required.values())
    if reserved_total > batch_size:  # over-subscribed: scale down, keep at least one pack each
        required = {
            env: max(pack_size, n * batch_size // reserved_total) for env, n in required.items()
        }
    taken = [False] * len(packs)
    total = 0
    for env, need in required.items():
        got = 0
        for index, pack in enumerate(packs):
            if got >= need:
                break
            if taken[index] or env_ids[pack[0]] != env:
                continue
            if total + pack_size <= batch_size:
                taken[index] = True
                got += pack_size
                total += pack_size
    for index in range(len(packs)):
        if total >= batch_size:
            break
        if not taken[index] and total + pack_size <= batch_size:
            taken[index] = True
            total += pack_size
    if total != batch_size:
        return None
    return [position for index, pack in enumerate(packs) if taken[index] for position in pack]
