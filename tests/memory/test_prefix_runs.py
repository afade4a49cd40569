"""The prefix cache held as runs (kvstudy/memory/prefix_runs.py) against the per-block cache (kvstudy/memory/prefix.py)
on the same random operations: every answer, count and evicted key (in order) equal."""
import random

import pytest

from kvstudy.memory.path_keys import PathKeys
from kvstudy.memory.prefix import BlockKeys, PrefixCache
from kvstudy.memory.prefix_runs import RunPrefixCache


def _prompts(rng, bs):
    """Segment lists sharing prefixes (a few roots, branching), as a trace's hash ids do."""
    out = []
    for _ in range(rng.randrange(4, 14)):
        if out and rng.random() < 0.7:
            base = rng.choice(out)
            segs = list(base[:rng.randrange(0, len(base) + 1)])
        else:
            segs = []
        for _ in range(rng.randrange(0, 5)):
            segs.append((rng.randrange(6), rng.choice([bs // 2 or 1, bs, 2 * bs, 3 * bs + 1, 5 * bs - 1, 7])))
        out.append(segs)
    return out


def _drive(seed):
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4, 16])
    num = rng.randrange(4, 60)
    block, runs = PrefixCache(num), RunPrefixCache(num, bs)
    ev_b, ev_r = [], []
    if seed % 2:  # told what is evicted (an offload tier), or not (each cache's own path)
        block.on_evict, runs.on_evict = ev_b.extend, ev_r.extend
    first_b, first_r = [], []
    block.on_first, runs.on_first = first_b.append, first_r.append
    make = BlockKeys(bs)
    prompts = _prompts(rng, bs)
    paths = PathKeys(prompts, bs) if seed % 4 >= 2 else None  # as the memory names blocks, or per segment
    live, nxt = {}, 0  # request -> (segments, tokens)

    def keys_of(segs, tokens):  # the runs as the namer gives them, or listed (the run cache bisects a list)
        keys = paths.keys(prompts.index(segs), tokens) if paths is not None else make(segs, tokens)
        return keys if rng.random() < 0.5 else list(keys)

    for step in range(300):
        op = rng.random()
        if op < 0.35:  # a start
            segs = rng.choice(prompts)
            tokens = rng.randrange(1, sum(n for _, n in segs) + 3 * bs + 2)
            keys = keys_of(segs, tokens)
            blocks = -(-tokens // bs) + (rng.random() < 0.2)  # now and then a block to spare
            most = (tokens - 1) // bs if rng.random() < 0.8 else rng.randrange(0, (tokens - 1) // bs + 1)
            need = block.new_blocks(keys, blocks, most)
            assert need == runs.new_blocks(keys, blocks, most)
            assert block.hit(keys, most) == runs.hit(keys, most)
            if need > block.free:
                continue
            upto = rng.choice([None, 0, rng.randrange(0, len(keys) + 1)])
            i, nxt = nxt, nxt + 1
            assert block.acquire(i, keys, blocks, most, upto) == runs.acquire(i, keys, blocks, most, upto)
            live[i] = (segs, tokens)
        elif op < 0.5 and live:  # a chunk scheduled
            i = rng.choice(sorted(live))
            n = rng.randrange(0, len(block.pending.get(i, ())) + 2)
            block.advance(i, n)
            runs.advance(i, n)
        elif op < 0.6 and live:  # a decode crossing a block boundary
            i = rng.choice(sorted(live))
            if block.free >= 1:
                block.grow(i)
                runs.grow(i)
        elif op < 0.62:  # a request sharing nothing, or one swapped in (blocks of its own, keys given at release)
            if block.free >= 2:
                i, nxt = nxt, nxt + 1
                block.grow(i, 2)
                runs.grow(i, 2)
                live[i] = ((), 0) if rng.random() < 0.5 else (rng.choice(prompts), 2 * bs)
        elif op < 0.85 and live:  # a release, its computed blocks cached (with keys its decode filled)
            i = rng.choice(sorted(live))
            segs, tokens = live.pop(i)
            how = rng.random()
            if how < 0.3 or not segs:
                assert block.release(i) == runs.release(i)
            else:
                computed = rng.randrange(0, tokens + 2 * bs)
                keys = keys_of(segs, computed) if rng.random() < 0.5 else None
                assert block.release(i, computed // bs, keys) == runs.release(i, computed // bs, keys)
        elif live:  # the queries a policy asks
            some = rng.sample(sorted(live), rng.randrange(0, len(live) + 1))
            gb, db = block.release_gain(some)
            gr, dr = runs.release_gain(some)
            assert gb == gr
            for i in some:
                assert block.freed_by(i) == runs.freed_by(i)
            segs = rng.choice(prompts)
            tokens = rng.randrange(1, sum(n for _, n in segs) + 2 * bs + 2)
            keys = keys_of(segs, tokens)
            blocks = -(-tokens // bs)
            most = (tokens - 1) // bs
            assert block.new_blocks(keys, blocks, most, db) == runs.new_blocks(keys, blocks, most, dr)
            for key in keys:
                assert block.cached(key) == runs.cached(key)
        assert (block.used, block.cached_blocks, block.evictions, len(block.evictor)) == \
            (runs.used, runs.cached_blocks, runs.evictions, runs.in_evictor), step
        assert ev_b == ev_r and first_b == first_r
        assert block.used <= num
    return block.evictions


@pytest.mark.parametrize("seed", range(200))
def test_runs_answer_as_the_per_block_cache(seed):
    _drive(seed)


def test_the_random_operations_evict():
    """The comparison above reaches eviction, partial runs and hits (else it would prove little)."""
    assert sum(_drive(seed) > 0 for seed in range(40)) >= 20


def test_a_hit_of_at_most_nothing_is_nothing():
    runs = RunPrefixCache(10, 4)
    runs.acquire(0, [4, 8], 2)
    assert runs.hit([4, 8], 0) == 0 and runs.hit([4, 8], -1) == 0 and runs.hit([4, 8]) == 2


def test_track_users_hands_over_to_the_per_block_cache_only_before_anything_is_cached():
    runs = RunPrefixCache(10, 4, per_block=lambda: None)
    runs.track_users()  # nothing cached: the memory switches
    runs.acquire(0, [4, 8], 3)
    with pytest.raises(ValueError, match="before any request"):
        runs.track_users()
