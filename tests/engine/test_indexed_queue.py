"""The engine's indexed waiting queue (kvstudy/engine/indexed_queue.py, issue 59): against a plain deque and a direct
count under random joins, starts and cache changes; and whole dfs_weight runs equal to the tree built over the whole
queue at every admission (SGLang's way, the code before)."""
import random
from collections import deque

import pytest

from kvstudy.engine.indexed_queue import IndexedQueue


@pytest.mark.parametrize("seed", range(15))
def test_order_smallest_and_matched_equal_a_direct_count(seed):
    rng = random.Random(seed)
    size = {i: rng.randint(1, 50) for i in range(400)}
    first = {i: rng.choice([None, "a", "b", "c", "d"]) for i in range(400)}
    cached = set()
    q = IndexedQueue(size.__getitem__, lambda i, tokens: first[i], cached.__contains__)
    ref, nxt = deque(), 0
    for _ in range(800):
        op = rng.random()
        if op < 0.35 and nxt < 400:
            q.append(nxt)
            ref.append(nxt)
            nxt += 1
        elif op < 0.45 and nxt < 398:
            items = [nxt, nxt + 1]
            nxt += 2
            q.extendleft(items)
            ref.extendleft(items)
        elif op < 0.65 and ref:
            i = rng.choice(list(ref))
            q.remove(i)
            ref.remove(i)
        elif op < 0.8:
            name = rng.choice("abcd")
            cached.add(name)
            for i in ref:  # the cache tells the queue whose first block it cached (one request's is enough)
                if first[i] == name:
                    q.told_cached(i)
                    break
        else:
            cached.discard(rng.choice("abcd"))  # an eviction: nobody is told
        assert list(q) == list(ref)
        if ref:
            assert q.smallest() == min(size[i] for i in ref)
        assert q.matched() == [i for i in ref if first[i] in cached]


@pytest.mark.parametrize("overrides", [
    ["+policy=dfs_weight"],
    ["+policy=sarathi", "policy.waiting_order=dfs_weight", "memory=paged_prefix"],
], ids=["vllm-dfs_weight", "sarathi-dfs_weight"])
def test_whole_dfs_weight_runs_equal_the_tree_over_the_whole_queue(overrides, monkeypatch):
    from kvstudy import api
    from kvstudy.policies import cache_orders, vllm

    cfg = [*overrides, "workload=shared_prompt", "memory.capacity_tokens=8000", "+demand=high",
           "workload.num_requests=600", "latency=linear", "engine.progress=false"]
    seen = []
    real = cache_orders.dfs_weight_order
    monkeypatch.setattr(cache_orders, "dfs_weight_order", lambda view, queue: seen.append(len(queue)) or real(view, queue))
    indexed, _ = api.simulate(api.compose(cfg))
    assert sum(seen) > 0  # some admissions had requests with a cached prefix: the tree was built
    init = vllm.VLLM.__init__

    def plain(self, *args, **kwargs):  # the code before: a plain deque, the tree over all of it, min over it
        init(self, *args, **kwargs)
        self.indexed_waiting = False

    monkeypatch.setattr(vllm.VLLM, "__init__", plain)
    reference, _ = api.simulate(api.compose(cfg))
    assert indexed.requests.equals(reference.requests) and indexed.iterations.equals(reference.iterations)
