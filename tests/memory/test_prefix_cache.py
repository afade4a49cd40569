"""kvstudy/memory/prefix.py (issue 36's memory item, the block bookkeeping): hand-worked cases, and the cache's hits
against an independent count on Mooncake's traces."""
import json
import random

import pytest

from kvstudy.memory.prefix import BlockKeys, PrefixCache, reusable_tokens
from kvstudy.workloads.trace import mooncake_segments
from kvstudy.running.paths import SHARED_REFERENCE


def trace_keys(make, hash_ids, prompt):
    """Keys of a prompt's full 16-token blocks from Mooncake-style 512-token hash ids."""
    return make(mooncake_segments(hash_ids, prompt), prompt)


def test_two_requests_sharing_three_blocks():
    c = PrefixCache(10)
    assert c.acquire(0, ["a", "b", "c"], 4) == 0 and c.used == 4
    assert c.new_blocks(["a", "b", "c", "x"], 5) == 2
    assert c.acquire(1, ["a", "b", "c", "x"], 5) == 3
    assert c.used == 6  # a, b, c once; 0's private block; x and 1's private block
    c.release(0)
    assert c.used == 5 and not c.evictor  # a, b, c still in use by 1
    c.release(1)
    assert c.used == 0 and list(c.evictor) == ["x", "c", "b", "a"]  # tail first: the prefix is evicted last


def test_a_shared_block_is_evicted_only_unused_and_least_recent():
    c = PrefixCache(4)
    c.acquire(0, ["a", "b"], 2)
    c.acquire(1, ["a", "c"], 2)  # shares a
    c.release(1)  # c to the evictor; a still used by 0
    assert list(c.evictor) == ["c"] and c.free == 2
    c.grow(0, 1)  # one uncached free block: no eviction
    assert c.evictions == 0
    c.grow(0, 1)  # none left: the least recently released cached block goes
    assert c.evictions == 1 and not c.evictor and c.used == 4
    with pytest.raises(MemoryError):
        c.grow(0, 1)


def test_a_fully_cached_prompt_still_computes_its_last_token():
    keys = trace_keys(BlockKeys(16), [7], 64)  # a 64-token prompt: 4 full blocks
    c = PrefixCache(20)
    c.acquire(0, keys, 5)
    c.release(0)
    # the same prompt again: 4 blocks cached, at most (64 - 1) // 16 = 3 reused; the 4th is computed again, and once
    # computed the request's copy is freed for the cached one (vLLM V0)
    assert c.acquire(1, keys, 5, most=(64 - 1) // 16, upto=3) == 3
    assert c.keys[1] == keys[:3] and c.private[1] == 2 and c.used == 5
    c.advance(1, 4)
    assert c.keys[1] == keys and len(c.keys[1]) == 4 and c.private[1] == 1 and c.used == 5 and not c.evictor


def test_recompute_after_preemption_reuses_its_own_blocks():
    keys = trace_keys(BlockKeys(16), [1, 2], 700)
    c = PrefixCache(100)
    c.acquire(0, keys, 50, most=(700 - 1) // 16)
    c.release(0)  # preempted by recompute: its prompt blocks stay cached
    c.acquire(1, ["other"], 30)  # another request meanwhile, room enough: nothing evicted
    assert c.acquire(0, keys, 50, most=(700 - 1) // 16) == len(keys) == 43


def test_capacity_is_never_exceeded_with_shared_blocks_counted_once():
    rng = random.Random(0)
    c = PrefixCache(50)
    running = set()
    for step in range(3000):
        if running and rng.random() < 0.45:
            i = rng.choice(sorted(running))
            c.release(i)
            running.discard(i)
        else:
            group = rng.randrange(3)
            keys = [(group, k) for k in range(rng.randrange(0, 8))]
            blocks = len(keys) + rng.randrange(0, 4)
            most = rng.randrange(0, len(keys) + 1)
            if blocks and c.new_blocks(keys, blocks, most) <= c.free:
                c.acquire(step, keys, blocks, most)
                running.add(step)
        distinct = {k for ks in c.keys.values() for k in ks if k is not None}
        assert c.used == len(distinct) + sum(c.private.values()) <= c.num_blocks
        assert not distinct & set(c.evictor) and len(c.evictor) <= c.free


def test_block_keys_chain_the_trace_blocks():
    make = BlockKeys(16)
    keys = trace_keys(make, [7, 8], 1024)
    chain = lambda key: key >> 32  # noqa: E731
    assert len(keys) == 64 and keys[0] == 16 and keys[31] == 512 and chain(keys[32]) == 1 and keys[32] & 0xFFFF == 16
    other = trace_keys(make, [7, 9], 600)  # trace block 9 is partial (88 tokens): a segment of its own length
    assert other[:32] == keys[:32] and chain(other[32]) == 2 and len(other) == 600 // 16
    assert chain(trace_keys(make, [7, 9], 1100)[32]) == 3  # the full block 9 is another chain than the partial one
    assert trace_keys(make, [7], 15) == []
    assert mooncake_segments([7, 9], 600) == [(7, 512), (9, 88)]


def test_block_keys_of_segments_across_boundaries():
    """A block spanning two segments is keyed by both: requests share it only if both agree up to its end."""
    make = BlockKeys(16)
    a = make([(1, 10), (2, 30)], 40)  # blocks end at 16 (in segment 2) and 32 (in segment 2); 40 % 16: no third
    b = make([(1, 10), (3, 30)], 40)
    c = make([(1, 10), (2, 30), (4, 50)], 90)
    assert len(a) == 2 and a[0] != b[0] and a[1] != b[1] and c[:2] == a and len(c) == 5
    assert make([(1, 20)], 100) == make([(1, 20)], 16)  # past the segments: no keys (the request's own blocks)


def test_independent_count_by_hand():
    assert reusable_tokens([[1, 2], [1, 2, 3], [4], [1, 5]], [1024, 1500, 100, 700]) == [0, 1024, 0, 512]
    assert reusable_tokens([[1], [1]], [512, 512]) == [0, 496]  # at most prompt - 1, in whole 16-token blocks


MOONCAKE = SHARED_REFERENCE / "traces-extra" / "mooncake"


@pytest.mark.skipif(not MOONCAKE.exists(), reason=f"needs Mooncake's traces in {MOONCAKE} (../shared, present in CI)")
@pytest.mark.parametrize("name,rows", [("conversation_trace.jsonl", 3000), ("synthetic_trace.jsonl", 1000)])
def test_cache_hits_equal_the_independent_count_on_mooncake(name, rows):
    """A cache too large to evict, requests one at a time: every request's hit is the longest run of its leading
    trace blocks seen in earlier prompts, times 512, in whole engine blocks, at most prompt - 1 tokens."""
    with open(MOONCAKE / name) as f:
        trace = [json.loads(line) for _, line in zip(range(rows), f)]
    cache, make, hits = PrefixCache(10 ** 9), BlockKeys(16), []
    for i, r in enumerate(trace):
        prompt = r["input_length"]
        hit = cache.acquire(i, trace_keys(make, r["hash_ids"], prompt), -(-(prompt + r["output_length"]) // 16),
                            most=(prompt - 1) // 16)
        hits.append(hit * 16)
        cache.release(i)
    assert hits == reusable_tokens([r["hash_ids"] for r in trace], [r["input_length"] for r in trace])
    assert sum(hits) > 0.1 * sum(r["input_length"] for r in trace)  # the traces do share prefixes


@pytest.mark.skipif(not MOONCAKE.exists(), reason=f"needs Mooncake's traces in {MOONCAKE} (../shared, present in CI)")
def test_mooncake_traces_load_as_traces():
    """workload=trace reads Mooncake's columns (timestamp in ms, input_length, output_length); each request keeps
    its file row as request_id. Without a long-context model most prompts are over the context: dropped, counted."""
    from kvstudy import api

    path = MOONCAKE / "conversation_trace.jsonl"
    with pytest.warns(UserWarning, match="dropped"):
        result, summary = api.simulate(api.compose([
            "+policy=vllm", "workload=trace", f"workload.path={path}", "workload.time_unit=ms",
            "workload.over_context=drop", "model=llama32_1b", "hardware=a100_tp1", "latency=linear",
            "workload.num_requests=40", "engine.progress=false"]))
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    req = result.requests
    assert summary["completed"] == 40
    for rid, prompt, output, arrival in zip(req.request_id, req.prompt_tokens, req.output_tokens, req.arrival_time):
        row = rows[int(rid)]
        assert (prompt, output) == (row["input_length"], row["output_length"])
        assert arrival == pytest.approx(row["timestamp"] / 1000)


def test_a_block_cached_meanwhile_is_shared_and_the_copy_freed():
    """B starts while A's prefill has scheduled only A's first block: B computes block 2 too. When A's second block is
    scheduled, its key is cached (B's): A's copy is freed and A shares B's (vLLM V0)."""
    c = PrefixCache(20)
    c.acquire(0, ["a", "b", "c"], 3, upto=1)
    assert c.acquire(1, ["a", "b"], 3) == 1 and c.used == 5
    c.advance(0, 3)
    assert c.ref == {"a": 2, "b": 2, "c": 1} and c.used == 4 and c.private == {0: 0, 1: 1}


def test_shared_blocks_behind_an_evictable_one_are_not_counted_as_shared():
    """A start's hit [x (evictable), y (in use)]: an allocation before it in the same step may evict x and end its hit
    there, so new_blocks counts y as new (an upper bound); with x in use too, both are shared."""
    c = PrefixCache(10)
    c.acquire(0, ["x"], 1)
    c.release(0)  # x in the evictor
    c.acquire(1, ["w", "y"], 2)
    c.ref["y"] = c.ref.pop("w")  # a state a request's lost prefix could leave: y in use while x is evictable
    assert c.hit(["x", "y"]) == 2 and c.new_blocks(["x", "y"], 3) == 3
    c.acquire(2, ["x"], 1)  # x in use
    assert c.new_blocks(["x", "y"], 3) == 1


def test_the_evictors_order_stays_small_when_nothing_is_evicted():
    c = PrefixCache(1000)
    for i in range(20000):
        c.acquire(i, ["p", "q"], 2)
        c.release(i)
    assert len(c.evictor.order) - c.evictor.head < 4096 + 2 * len(c.evictor) + 2
    assert list(c.evictor) == ["q", "p"]


def test_block_keys_equal_a_block_by_block_count():
    """BlockKeys' arithmetic runs against the definition, block by block: a block's key names the chain of segments
    up to the one its last token lies in, and its end's offset there."""
    rng = random.Random(1)
    for _ in range(300):
        bs = rng.choice([1, 4, 16, 32])
        segments = [(rng.randrange(5), rng.randrange(1, 70)) for _ in range(rng.randrange(0, 6))]
        tokens = rng.randrange(0, 400)
        make = BlockKeys(bs)
        chains, out, start, chain = {}, [], 0, -1
        ends = []  # (end of segment, chain id through it, start of segment)
        for key, length in segments:
            chain = chains.setdefault((chain, key, length), len(chains))
            ends.append((start + length, chain, start))
            start += length
        for k in range(tokens // bs):
            last = (k + 1) * bs - 1
            hit = next(((c, s0) for end, c, s0 in ends if s0 <= last < end), None)
            if hit is None:
                break
            out.append(hit[0] << 32 | (last + 1 - hit[1]))
        assert make(segments, tokens) == out, (bs, segments, tokens)
