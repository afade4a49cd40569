"""SGLang's cache-aware waiting orders (kvstudy/policies/cache_orders.py) by hand on a real prefix cache, and LPM
against FCFS through the engine."""
import json
from types import SimpleNamespace

from kvstudy import api
from kvstudy.memory.paged import PagedMemory
from kvstudy.policies.cache_orders import LPM_MAX_QUEUE, dfs_weight_order, lpm_order, ordered


def view_of(segments, prompts, waiting, cached):
    """A view whose memory has cached the whole prompts of the requests in ``cached`` (then released them)."""
    mem = PagedMemory(capacity_tokens=16 * 1000, block_size=16, prefix_caching=True)
    mem.bind(1)
    mem.set_segments(segments)
    for i in cached:
        mem.start(i, prompts[i])
        mem.advance(i, prompts[i])
        mem.release(i, prompts[i])
    return SimpleNamespace(memory=mem, prompt=prompts, waiting_generated=[0] * len(prompts), waiting=list(waiting))


def seg(*ids):
    return [(k, 16) for k in ids]


def test_lpm_sorts_by_cached_prefix_stably():
    # cached: request 0's blocks a b c d; waiting 1..4 match 0, 3, 1 and 3 blocks of it (whole sequence, uncapped)
    segments = [seg(1, 2, 3, 4), seg(9, 9), seg(1, 2, 3, 7), seg(1, 8), seg(1, 2, 3)]
    prompts = [64, 32, 64, 32, 48]
    view = view_of(segments, prompts, [1, 2, 3, 4], cached=[0])
    assert lpm_order(view, [1, 2, 3, 4]) == [2, 4, 3, 1]
    assert ordered(view, "lpm") == [2, 4, 3, 1] and ordered(view, "fcfs") == [1, 2, 3, 4]
    long_queue = [1] * (LPM_MAX_QUEUE + 1)
    assert lpm_order(view, long_queue) is long_queue  # SGLang: above 128 waiting, no reordering


def test_dfs_weight_visits_the_heaviest_subtree_first_and_a_node_after_its_subtree():
    # cached chains: x y z (request 0) and x w (request 1). Waiting: 2 matches x only; 3 and 4 match x y z;
    # 5 matches x w; 6 matches nothing. Weights: x 4, (x y) 2... so x's subtree: y-branch (2) before w-branch (1),
    # then x's own request 2; the unmatched request 6 last.
    segments = [seg(1, 2, 3), seg(1, 4), seg(1, 5), seg(1, 2, 3, 6), seg(1, 2, 3), seg(1, 4, 7), seg(8)]
    prompts = [48, 32, 32, 64, 48, 48, 16]
    view = view_of(segments, prompts, [6, 5, 2, 3, 4], cached=[0, 1])
    assert dfs_weight_order(view, [6, 5, 2, 3, 4]) == [3, 4, 5, 2, 6]


def test_lpm_admits_the_cached_request_first(tmp_path):
    """A holds the cache's room for one more request: B (nothing cached) arrived before C (A's prefix). FCFS starts B
    first, LPM C."""
    rows = [{"arrival_time": 0.0, "prompt_tokens": 160, "output_tokens": 30, "hash_ids": list(range(1, 11))},
            {"arrival_time": 0.01, "prompt_tokens": 160, "output_tokens": 5, "hash_ids": list(range(20, 30))},
            {"arrival_time": 0.02, "prompt_tokens": 176, "output_tokens": 5, "hash_ids": list(range(1, 11)) + [99]}]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    starts = {}
    for policy in ("vllm", "lpm"):
        result, _ = api.simulate(api.compose([
            f"+policy={policy}", "workload=trace", f"workload.path={path}", "workload.hash_block_size=16",
            "model=llama32_1b", "hardware=a100_tp1", "memory.prefix_caching=true", "memory.watermark=0",
            "memory.capacity_tokens=400", "latency=linear", "engine.progress=false"]))
        starts[policy] = result.requests.sort_values("first_scheduled_time").request_id.tolist()
    assert starts == {"vllm": [0, 1, 2], "lpm": [0, 2, 1]}
