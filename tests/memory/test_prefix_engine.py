"""memory.prefix_caching=true through the engine (issue 36): hand-worked runs of tiny traces whose prompts share
16-token blocks (``hash_ids`` with ``workload.hash_block_size=16``: one id per engine block), the per-request and
per-iteration records, and the hits against the independent count on Mooncake's trace."""
import json

import numpy as np
import pytest

from kvstudy import api
from kvstudy.errors import KvStudyError
from kvstudy.memory.prefix import reusable_tokens
from kvstudy.running.paths import SHARED_REFERENCE

BASE = ["workload=trace", "workload.hash_block_size=16", "model=llama32_1b", "hardware=a100_tp1", "memory=paged",
        "memory.prefix_caching=true", "memory.watermark=0", "latency=linear", "engine.progress=false"]


def run(tmp_path, rows, *overrides, policy="vllm"):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result, summary = api.simulate(api.compose(BASE + [f"+policy={policy}", f"workload.path={path}", *overrides]))
    return result, summary


def row(t, prompt, output, ids):
    return {"arrival_time": t, "prompt_tokens": prompt, "output_tokens": output, "hash_ids": ids}


def test_two_requests_sharing_three_blocks(tmp_path):
    """B (64 tokens: blocks 1, 2, 3 shared with A, then its own) starts while A runs: its prefill computes 16 tokens
    after A's 48, and the cache holds the three shared blocks once."""
    result, summary = run(tmp_path, [row(0.0, 64, 20, [1, 2, 3, 4]), row(0.05, 64, 20, [1, 2, 3, 5])],
                          "memory.capacity_tokens=4096")
    req, it = result.requests, result.iterations
    assert req.prefix_cached_tokens.tolist() == [0, 48]
    assert it.prefill_tokens[it.prefill_tokens > 0].tolist() == [64, 16]
    b_start = int(np.flatnonzero(it.prefill_tokens.to_numpy() == 16)[0])
    # A holds blocks(64 + its tokens so far); B 4 blocks (s + g = 64), 3 of them A's: one new block
    before = int(it.blocks_used[b_start - 1])
    assert int(it.blocks_used[b_start]) == before + 1
    assert int(it.cached_blocks[b_start]) == 5  # A's 4 prompt blocks and B's block 5
    assert summary["prefix_hit_rate"] == pytest.approx(48 / 128)


def test_a_fully_cached_prompt_still_computes_its_last_token(tmp_path):
    result, _ = run(tmp_path, [row(0.0, 64, 2, [1, 2, 3, 4]), row(5.0, 64, 2, [1, 2, 3, 4])],
                    "memory.capacity_tokens=4096")
    assert result.requests.prefix_cached_tokens.tolist() == [0, 48]  # at most (64 - 1) // 16 = 3 blocks
    assert result.iterations.prefill_tokens[result.iterations.prefill_tokens > 0].tolist() == [64, 16]


def test_an_unused_block_is_evicted_least_recent_first(tmp_path):
    """A cache of 6 blocks. A (blocks 1-2, then a decode block of its own) finishes, then B (3-4): their keyed blocks
    wait in the evictor, A's released first. C (blocks 5-7 and a decode block) needs 4 blocks with 2 uncached free:
    A's two go, B's stay, so B's prompt again hits and A's misses."""
    rows = [row(0.0, 32, 2, [1, 2]), row(1.0, 32, 2, [3, 4]), row(2.0, 48, 2, [5, 6, 7]),
            row(3.0, 33, 2, [3, 4]), row(4.0, 33, 2, [1, 2])]
    result, summary = run(tmp_path, rows, "memory.capacity_tokens=96")
    assert result.requests.prefix_cached_tokens.tolist() == [0, 0, 0, 32, 0]
    assert summary["prefix_evictions"] >= 2 and int(result.iterations.blocks_used.max()) <= 6


def test_recompute_after_preemption_reuses_its_own_blocks(tmp_path):
    """A cache of 15 blocks, A and B with 6-block prompts. At 8 blocks each (context 113) their decodes outgrow it:
    vLLM preempts B by recompute; its 6 prompt blocks go to the evictor, its decode blocks are freed. A then needs
    one more block (9 at most: 96 + 40 - 1 tokens), which an uncached free block gives, so nothing of B's is evicted
    and B's recompute of 96 + 17 tokens skips its whole prompt (its later decode blocks do evict A's)."""
    rows = [row(0.0, 96, 40, list(range(1, 7))), row(0.0, 96, 60, list(range(11, 17)))]
    result, summary = run(tmp_path, rows, "memory.capacity_tokens=240")
    req = result.requests
    assert req.preemptions.tolist() == [0, 1] and req.state.tolist() == ["done", "done"]
    assert req.prefix_cached_tokens.tolist() == [0, 0]
    assert req.prefix_cached_later_tokens.tolist() == [0, 96]
    restart = int(np.flatnonzero(result.iterations.prefill_tokens.to_numpy() == 96 + 17 - 96)[0])
    assert int(result.iterations.evictions[:restart + 1].sum()) == 0
    assert int(req.recomputed_tokens[1]) == 96 + 17 - 1  # the KV it dropped (its prompt's survives in the cache)


def test_capacity_is_never_exceeded_with_shared_blocks_counted_once(tmp_path):
    """A random trace sharing prefixes heavily under memory pressure, each policy family: blocks in use never
    exceed the cache, and the memory's distinct count agrees with a recount from the cache's references."""
    rng = np.random.default_rng(0)
    rows = []
    for k in range(300):
        family = int(rng.integers(4))
        n = int(rng.integers(1, 12))
        ids = [family * 1000 + j for j in range(n)]
        rows.append(row(float(k) * 0.05, 16 * n + int(rng.integers(0, 16)), int(rng.integers(1, 80)), ids))
    for policy in ("vllm", "sarathi", "mcsf", "mcsf_prefix", "rr_sjf", "lpm", "dfs_weight"):
        result, summary = run(tmp_path, rows, "memory.capacity_tokens=1600", policy=policy)
        it = result.iterations
        assert summary["status"] == "completed", policy
        assert int(it.blocks_used.max()) <= 100 and (it.blocks_free >= 0).all(), policy
        assert summary["prefix_hit_rate"] > 0.1, policy


def test_swap_keeps_its_semantics(tmp_path):
    rows = [row(0.0, 96, 40, list(range(1, 7))), row(0.0, 96, 60, list(range(11, 17)))]
    result, _ = run(tmp_path, rows, "memory.capacity_tokens=240", "policy.preemption_mode=swap")
    req = result.requests
    assert req.preemptions_swap.tolist() == [0, 1] and req.state.tolist() == ["done", "done"]


def test_off_by_default_and_refused_with_embedding():
    cfg = api.compose(["+policy=vllm", "memory=paged"])
    assert cfg.memory.prefix_caching is False
    with pytest.raises(KvStudyError, match="embedding"):
        api.simulate(api.compose(["+policy=cacheopt", "memory=paged", "memory.prefix_caching=true",
                                  "workload.num_requests=20", "+demand=high", "latency=linear",
                                  "engine.progress=false"]))


MOONCAKE = SHARED_REFERENCE / "traces-extra" / "mooncake" / "conversation_trace.jsonl"


@pytest.mark.slow  # over about 4 s (measured 4.3-14 s, issue 54's fast-tier budget)
@pytest.mark.skipif(not MOONCAKE.exists(), reason=f"needs Mooncake's trace {MOONCAKE} (../shared, present in CI)")
def test_hits_equal_the_independent_count_on_mooncake():
    """A cache too large to evict and requests far apart: every request's prefix_cached_tokens is the longest run of
    its leading trace blocks seen in earlier prompts, times 512, in whole engine blocks, at most prompt - 1."""
    result, summary = api.simulate(api.compose([
        "+policy=vllm", "workload=trace", f"workload.path={MOONCAKE}", "workload.time_unit=ms",
        "workload.over_context=drop", "workload.num_requests=3000", "workload.rate_scale=0.01", "model=llama32_1b",
        "hardware=a100_tp1", "memory=paged", "memory.prefix_caching=true", "memory.capacity_tokens=4000000",
        "latency=linear", "engine.progress=false"]))
    req = result.requests
    with open(MOONCAKE) as f:
        trace = [json.loads(line) for line in f]
    kept = [trace[i] for i in req.request_id]  # the file's rows (prompts over the model's context were dropped)
    expected = reusable_tokens([r["hash_ids"] for r in kept], [r["input_length"] for r in kept])
    assert summary["status"] == "completed" and summary["prefix_evictions"] == 0
    assert req.prefix_cached_tokens.tolist() == expected
    assert sum(expected) > 0.1 * req.prompt_tokens.sum()


def test_prefix_aware_mcsf_counts_shared_blocks_once(tmp_path):
    """A (10 blocks of prompt, long output) runs; B shares A's 10 blocks and adds one. In a cache of 20 blocks
    eq. (5) per request charges B 11+ blocks beside A's 10+, so MC-SF waits for A to finish; the prefix-aware eq. (5)
    charges B its own block only (A holds the shared ones longer) and starts it at once."""
    rows = [row(0.0, 160, 40, list(range(1, 11))), row(0.01, 176, 5, list(range(1, 11)) + [99])]
    starts = {}
    for policy in ("mcsf", "mcsf_prefix"):
        result, summary = run(tmp_path, rows, "memory.capacity_tokens=320", "memory.prefix_caching=true",
                              policy=policy)
        req = result.requests
        starts[policy] = bool(req.first_scheduled_time[1] < req.completion_time[0])
        assert int(result.iterations.blocks_used.max()) <= 20 and summary["status"] == "completed"
    assert starts == {"mcsf": False, "mcsf_prefix": True}


def test_a_prompt_longer_than_the_stall_limit_in_chunks_completes(tmp_path):
    """Sarathi prefills a 400-token prompt in 16-token chunks: 25 iterations without a token, more than
    engine.stall_limit=5, each taking the prefill further than it got: progress, not a stall."""
    result, summary = run(tmp_path, [row(0.0, 400, 3, [1]), row(0.0, 40, 3, [2])], "memory.capacity_tokens=1024",
                          "policy.chunk_size=16", "engine.stall_limit=5", policy="sarathi")
    assert summary["status"] == "completed" and (result.requests.state == "done").all()


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_hash_ids_read_from_every_trace_format(tmp_path, suffix):
    import pandas as pd

    from kvstudy.workloads.trace import trace

    df = pd.DataFrame([row(0.0, 40, 2, [1, 2, 3]), row(1.0, 20, 2, [1, 9])])
    path = tmp_path / f"t{suffix}"
    {".parquet": lambda: df.to_parquet(path), ".csv": lambda: df.to_csv(path, index=False),
     ".jsonl": lambda: df.to_json(path, orient="records", lines=True)}[suffix]()
    out = trace(str(path), hash_block_size=16)
    assert out["segments"].tolist() == [[(1, 16), (2, 16), (3, 8)], [(1, 16), (9, 4)]]
    bad = pd.DataFrame([row(0.0, 20, 2, [1, 2, 3])])
    bad.to_json(tmp_path / "bad.jsonl", orient="records", lines=True)
    with pytest.raises(KvStudyError, match="row 0 has 3 ids for a prompt of 20 tokens"):
        trace(str(tmp_path / "bad.jsonl"), hash_block_size=16)
