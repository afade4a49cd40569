"""The offload tiers held as runs (kvstudy/memory/offload_runs.py) against the per-key tiers they replaced (the
reference below, the code before issue 59's item 3, on kvstudy/memory/prefix.py's ``LruKeys``): the same random
writes, loads and lookups give every tier's keys in the same order, the same counts and owners."""
import random
from collections import deque

import pytest

from kvstudy.memory.offload import OffloadConnector, OffloadTiers, Tier
from kvstudy.memory.offload_runs import RunLru, falling_runs, rising_runs
from kvstudy.memory.prefix import KeyRuns, LruKeys

STEP = 16


class ReferenceTiers:
    """The per-key tiers: each an ``LruKeys``; a block in one tier at a time; writes touch, demote, drop."""

    def __init__(self, capacities, shared):
        self.tiers = [LruKeys() for _ in capacities]
        self.capacity, self.shared = list(capacities), shared
        self.written = [0] * len(capacities)
        self.read = [0] * len(capacities)
        self.owner = {}

    def level(self, key):
        for k, tier in enumerate(self.tiers):
            if key in tier.where:
                return k
        return None

    def put(self, keys, replica):
        held = self.tiers[0].where
        fresh = [key for key in keys if key not in held]
        for tier in self.tiers[1:]:
            deque(map(tier.remove, [key for key in fresh if key in tier.where]), maxlen=0)
        if self.shared:
            self.owner.update(dict.fromkeys(fresh, replica))
        self._append(0, keys)
        return len(fresh)

    def _append(self, level, keys):
        tier = self.tiers[level]
        before = len(tier)
        tier.extend(keys)
        self.written[level] += len(tier) - before
        over = len(tier) - self.capacity[level]
        if over > 0:
            old = []
            tier.pop_first(over, old)
            if level + 1 < len(self.tiers):
                self._append(level + 1, old)
            elif self.shared:
                deque(map(self.owner.pop, old), maxlen=0)

    def match(self, keys, start, most):
        out = []
        for k in range(start, min(most, len(keys))):
            level = self.level(keys[k])
            if level is None:
                break
            out.append(level)
        return out

    def load(self, keys, start, count):
        chunk = list(keys[start:start + count])
        levels = [self.level(key) for key in chunk]
        for level, tier in enumerate(self.tiers):
            mine = [key for key, lv in zip(chunk, levels) if lv == level]
            if mine:
                tier.extend(mine[::-1])
                self.read[level] += len(mine)


def key(chain, j):
    return (chain << 32) + STEP * (j + 1)


def _request_keys(rng):
    """A request's keys: rising, chain after chain (each from its first block), as BlockKeys makes them."""
    chains = sorted(rng.sample(range(1, 7), rng.randrange(1, 4)))
    firsts, starts = [], [0]
    for c in chains:
        n = rng.randrange(1, 10)
        firsts.append(key(c, 0))
        starts.append(starts[-1] + n)
    runs = KeyRuns(firsts, starts, STEP)
    return runs if rng.random() < 0.5 else list(runs)


def _evicted(rng):
    """A GPU's evicted batch: runs of a chain's blocks from the top down, chain after chain; now and then a chain
    twice, below a gap (two of the cache's runs of one chain; never one key twice)."""
    firsts, starts, taken = [], [0], {}
    for c in rng.choices(range(1, 7), k=rng.randrange(1, 4)):
        top = min(rng.randrange(1, 10), taken.get(c, 10) - 1)  # below what the batch took of the chain already
        if top < 1:
            continue
        n = rng.randrange(1, top + 1)
        firsts.append(key(c, top - 1))
        starts.append(starts[-1] + n)
        taken[c] = top - n
    runs = KeyRuns(firsts, starts, -STEP)
    return runs if rng.random() < 0.5 else list(runs)


def _decode_writes(rng, longest, share):
    """A decode evicting a chain block by block: one key a write (``KeyRuns`` with probability ``share``, else a
    list), each below the one before, fewer than ``longest``; as (the write, its key)."""
    c, top = rng.randrange(1, 7), rng.randrange(1, 10)
    return [(KeyRuns([key(c, j)], [0, 1], -STEP) if rng.random() < share else [key(c, j)], key(c, j))
            for j in range(top - 1, max(-1, top - 1 - rng.randrange(1, longest)), -1)]


def _lookup(rng):
    """A request's keys, where its lookup starts and the most it may match."""
    keys = _request_keys(rng)
    start = rng.randrange(0, len(keys))
    return keys, start, rng.randrange(start, len(keys) + 2)


def _drive(seed):
    rng = random.Random(seed)
    capacities = [rng.choice([0, 1, rng.randrange(2, 40)])] + ([rng.randrange(0, 40)] if seed % 3 == 0 else [])
    shared = seed % 2 == 1
    pool = OffloadTiers([Tier(name, n * 1e-9, 1.0, 1.0) for name, n in zip(["host", "disk"], capacities)],
                        shared=shared)
    views = [OffloadConnector(pool, 0), OffloadConnector(pool, 1)]
    views[0].bind(STEP, 1)  # one byte per block: capacities in blocks
    views[1].block_size = STEP
    ref = ReferenceTiers(capacities, shared)
    loads = 0
    for _ in range(200):
        op = rng.random()
        replica = rng.randrange(2)
        if op < 0.35:
            batch = _evicted(rng)
            assert pool.put(batch, replica) == ref.put(list(batch), replica)
        elif op < 0.5:
            for single, k in _decode_writes(rng, 5, 0.5):
                assert pool.put(single, replica) == ref.put([k], replica)
        else:
            keys, start, most = _lookup(rng)
            levels = pool.match(keys, start, most)
            assert levels == ref.match(keys, start, most)
            if levels and op < 0.85:
                count = len(levels) if rng.random() < 0.7 else rng.randrange(1, len(levels) + 1)  # part of it
                views[replica].load(0, keys, start, count)
                ref.load(keys, start, count)
                loads += 1
        for tier, lru in zip(pool.tiers, ref.tiers):
            assert list(tier.blocks) == list(lru) and len(tier.blocks) == len(lru)
        assert [t.written_blocks for t in pool.tiers] == ref.written
        assert [t.read_blocks for t in pool.tiers] == ref.read
        assert pool.owner == ref.owner
        for k in range(1, 7):
            for j in range(10):
                assert pool.level(key(k, j)) == ref.level(key(k, j))
    return loads


@pytest.mark.parametrize("seed", range(120))
def test_run_tiers_hold_what_the_per_key_tiers_hold(seed):
    _drive(seed)


def test_the_random_operations_load_and_overflow():
    assert sum(_drive(seed) for seed in range(12)) > 100


def test_a_shared_pool_of_replicas_with_two_block_sizes_is_refused():
    from kvstudy.errors import ConfigError

    pool = OffloadTiers([Tier("host", 1.0, 1.0, 1.0)], shared=True)
    first, second = OffloadConnector(pool, 0), OffloadConnector(pool, 1)
    first.bind(16, 1)
    with pytest.raises(ConfigError, match="different memory.block_size"):
        second.bind(32, 1)


def test_a_key_that_is_not_the_caches_is_named():
    with pytest.raises(TypeError, match="'a' is not a block key"):
        falling_runs(["a"], STEP)


def test_runs_of_keys():
    assert falling_runs([key(1, 2), key(1, 1), key(2, 0), key(1, 0)], STEP) == \
        [(key(1, 1), key(1, 3)), (key(2, 0), key(2, 1)), (key(1, 0), key(1, 1))]
    assert rising_runs([key(1, 0), key(1, 1), key(2, 0)], 1, 3, STEP) == [(key(1, 1), key(1, 2)), (key(2, 0), key(2, 1))]
    lru = RunLru(STEP)
    lru.add(key(1, 0), key(1, 5))
    lru.cut(key(1, 2), key(1, 3))
    assert list(lru) == [key(1, 4), key(1, 3), key(1, 1), key(1, 0)] and lru.held_from(key(1, 0)) == key(1, 2)
    assert lru.gaps(key(1, 0), key(1, 6)) == [(key(1, 2), key(1, 3)), (key(1, 5), key(1, 6))]


def _drive_deferred(seed):
    """The connectors' writes (``save``: ``put_later``, a falling run of single-block writes taken as one) against
    ``put`` carried out at once with each replica's new blocks counted as ``save`` counted them before; reads come
    only now and then, so writes pile up between them. Returns how many writes were taken without being carried out
    at once."""
    rng = random.Random(seed)
    capacities = [rng.choice([0, 1, rng.randrange(2, 40)])] + ([rng.randrange(0, 40)] if seed % 3 == 0 else [])
    shared, replicas = seed % 2 == 1, 2 + seed % 3
    pools, views = [], []
    for _ in range(2):
        pool = OffloadTiers([Tier(name, n * 1e-9, 1.0, 1.0) for name, n in zip(["host", "disk"], capacities)],
                            shared=shared)
        views.append([OffloadConnector(pool, r) for r in range(replicas)])
        views[-1][0].bind(STEP, 1)
        for view in views[-1][1:]:
            view.block_size = STEP
        pools.append(pool)
    deferred, direct = pools
    written = [[0] * len(capacities) for _ in range(replicas)]  # per replica, as save counted before
    taken = 0

    def put(batch, replica):
        before = [t.written_blocks for t in direct.tiers]
        direct.put(batch, replica)
        for k, t in enumerate(direct.tiers):
            written[replica][k] += t.written_blocks - before[k]

    def same():
        first = rng.randrange(3)  # which read comes first: each alone carries a write taken out
        if first == 0:
            assert deferred.owner == direct.owner
        elif first == 1:
            names = [t.name for t in direct.tiers]
            assert [[v.summary()["tiers"][name]["written_blocks"] for name in names] for v in views[0]] == written
        assert deferred.owner == direct.owner
        for a, b in zip(deferred.tiers, direct.tiers):
            assert list(a.blocks) == list(b.blocks)
            assert (a.written_blocks, a.read_blocks) == (b.written_blocks, b.read_blocks)
        assert [v.written for v in views[0]] == written

    for _ in range(150):
        op, replica = rng.random(), rng.randrange(replicas)
        if op < 0.25:
            batch = _evicted(rng)
            views[0][replica].save(batch)
            put(batch, replica)
        elif op < 0.8:  # now and then a block a tier holds
            for single, _ in _decode_writes(rng, 6, 0.7):
                taken += deferred._pending is not None
                views[0][replica].save(single)
                put(single, replica)
        else:
            keys, start, most = _lookup(rng)
            levels = deferred.match(keys, start, most)
            assert levels == direct.match(keys, start, most)
            if levels and op < 0.9:
                count = rng.randrange(1, len(levels) + 1)
                views[0][replica].load(0, keys, start, count)
                views[1][replica].load(0, keys, start, count)
        if rng.random() < 0.1:
            same()
    same()
    return taken


def test_a_write_taken_is_counted_before_the_pool_empties():
    """A shared pool emptied by replica 0's bind (a run's start) counts replica 1's write taken first, as a write at
    once was counted; its owner map shows the write before any tier is read."""
    pool = OffloadTiers([Tier("host", 4e-9, 1.0, 1.0)], shared=True)
    first, second = OffloadConnector(pool, 0), OffloadConnector(pool, 1)
    first.bind(STEP, 1)
    second.bind(STEP, 1)
    second.save(KeyRuns([key(1, 2)], [0, 1], -STEP))
    second.save(KeyRuns([key(1, 1)], [0, 1], -STEP))
    assert pool.owner == {key(1, 2): 1, key(1, 1): 1}
    second.save(KeyRuns([key(1, 0)], [0, 1], -STEP))
    first.bind(STEP, 1)
    assert second.written == [3] and pool.owner == {} and list(pool.tiers[0].blocks) == []


@pytest.mark.parametrize("seed", range(120))
def test_writes_taken_as_runs_leave_the_tiers_as_writes_at_once(seed):
    _drive_deferred(seed)


def test_the_deferred_writes_are_taken_and_continued():
    assert sum(_drive_deferred(seed) for seed in range(12)) > 200
