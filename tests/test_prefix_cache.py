"""kvstudy/memory/prefix.py (issue 36's memory item, the block bookkeeping): hand-worked cases, and the cache's hits
against an independent count on Mooncake's traces."""
import json
import random

import pytest

from kvstudy.memory.prefix import BlockKeys, PrefixCache, reusable_tokens
from kvstudy.paths import SHARED_REFERENCE


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
    keys = BlockKeys(512, 16)([7, 8], 64)  # a 64-token prompt: 4 full blocks
    c = PrefixCache(20)
    c.acquire(0, keys, 5)
    c.release(0)
    # the same prompt again: 4 blocks cached, at most (64 - 1) // 16 = 3 reused; the 4th is computed again beside
    # its cached copy (the request's own block)
    assert c.acquire(1, keys, 5, most=(64 - 1) // 16) == 3
    assert c.keys[1] == keys[:3] and c.private[1] == 2 and c.used == 5


def test_recompute_after_preemption_reuses_its_own_blocks():
    keys = BlockKeys(512, 16)([1, 2], 700)
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
        distinct = {k for ks in c.keys.values() for k in ks}
        assert c.used == len(distinct) + sum(c.private.values()) <= c.num_blocks
        assert not distinct & set(c.evictor) and len(c.evictor) <= c.free


def test_block_keys_chain_the_trace_blocks():
    make = BlockKeys(512, 16)
    keys = make([7, 8], 1024)
    assert len(keys) == 64 and keys[0] == (0, 0) and keys[31] == (0, 31) and keys[32] == (1, 0)
    other = make([7, 9], 600)  # trace block 9 is partial (88 tokens): chained with its length
    assert other[:32] == keys[:32] and other[32] == (2, 0) and len(other) == 600 // 16
    assert make([7, 9], 1100)[32] == (3, 0)  # the full block 9 is another chain than the partial one
    assert make([7], 15) == []
    with pytest.raises(ValueError, match="not a multiple"):
        BlockKeys(500, 16)


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
    cache, make, hits = PrefixCache(10 ** 9), BlockKeys(512, 16), []
    for i, r in enumerate(trace):
        prompt = r["input_length"]
        hit = cache.acquire(i, make(r["hash_ids"], prompt), -(-(prompt + r["output_length"]) // 16),
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
