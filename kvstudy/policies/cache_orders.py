"""SGLang's cache-aware orders of the waiting queue (``python/sglang/srt/managers/schedule_policy.py``, 2025), over
kvstudy's prefix cache (memory.prefix_caching=true, kvstudy/memory/prefix.py). A policy with ``waiting_order``
``lpm`` or ``dfs_weight`` (kvstudy/policies/vllm.py) walks the waiting queue in this order instead of FCFS; its
admission against memory is unchanged (vLLM's), so a comparison isolates what the order does.

* ``lpm``: longest prefix match first: the sort key is the number of the request's tokens (prompt + generated, the
  whole sequence, not capped at its last token, as SGLang's key) found in the cache now; a stable sort, so ties keep
  queue order. As SGLang, when more than ``LPM_MAX_QUEUE`` (128) requests wait the queue is taken in its own order
  (FCFS here: SGLang keeps its previous order with arrivals appended). SGLang's in-batch deprioritisation (a request
  with a short hit that shares >= 32 tokens with an earlier waiting one goes last) is not modelled.
* ``dfs_weight``: the waiting requests' matched prefixes form a tree (SGLang's radix tree restricted to the paths the
  waiting requests match); a node's weight is the number of waiting requests whose match ends in its subtree.
  Depth-first from the root, children heaviest first (ties: the order in which the queue first reaches them; SGLang:
  the tree's insertion order), each node's requests after its whole subtree, unmatched requests last.

Either is computed only when the policy is about to admit. LPM costs O(sum of matched blocks) over the queue (at most
128 requests). ``dfs_weight`` builds its tree over the requests whose first block is cached only, which the engine's
queue keeps (kvstudy/engine/indexed_queue.py, issue 59): the others are at the root, last, in queue order, so they
are read only as far as the admission walk goes. The order is the same as the tree over the whole queue.
"""
from __future__ import annotations

from itertools import chain
from typing import Dict, Iterable, List

#: SGLang: above this many waiting requests LPM falls back to FCFS (its matching would cost too much per step)
LPM_MAX_QUEUE = 128
ORDERS = ("fcfs", "lpm", "dfs_weight")


def _matched(view, i: int) -> list:
    """Keys of request i's blocks (its whole sequence so far) found in the cache, leading ones."""
    mem = view.memory
    keys = mem.keys(i, view.prompt[i] + view.waiting_generated[i])
    return keys[:mem.cache.hit(keys)]


def lpm_order(view, queue: List[int]) -> List[int]:
    if len(queue) > LPM_MAX_QUEUE:
        return queue
    hits = {i: len(_matched(view, i)) for i in queue}
    return sorted(queue, key=lambda i: -hits[i])


def dfs_weight_order(view, queue: List[int]) -> List[int]:
    root = None
    children: Dict[object, list] = {root: []}
    parent_of: Dict[object, object] = {}
    at: Dict[object, list] = {}
    for i in queue:
        node = root
        for key in _matched(view, i):
            if key not in children:
                children[key] = []
                children[node].append(key)
                parent_of[key] = node
            node = key
        at.setdefault(node, []).append(i)
    weight = dict.fromkeys(children, 0)
    for node, reqs in at.items():  # each request adds one to every node on its path
        n = len(reqs)
        while node is not None:
            weight[node] += n
            node = parent_of[node]
    out: List[int] = []
    stack = [(root, False)]
    while stack:  # post-order: a node's requests after its subtree; children heaviest first (stable)
        node, done = stack.pop()
        if done:
            out.extend(at.get(node, ()))
            continue
        stack.append((node, True))
        for child in reversed(sorted(children[node], key=lambda c: -weight[c])):
            if weight[child]:
                stack.append((child, False))
    return out


def ordered(view, order: str) -> Iterable[int]:
    """The waiting queue in ``order`` (FCFS: the engine's queue order, recompute victims first). Taken in the
    engine's order, it is the engine's queue itself, not a copy (the caller only reads it): an admission under
    overload then costs the same at any queue length (issue 47). ``dfs_weight`` on an indexed queue: the tree of the
    requests whose first block is cached, then the others as the queue has them, read lazily (issue 59)."""
    waiting = view.waiting
    if (order == "fcfs" or getattr(view.memory, "cache", None) is None or len(waiting) < 2
            or (order == "lpm" and len(waiting) > LPM_MAX_QUEUE)):
        return waiting
    if order == "dfs_weight" and hasattr(waiting, "matched"):
        matched = waiting.matched()
        if not matched:
            return waiting
        inside = set(matched)
        return chain(dfs_weight_order(view, matched), (i for i in waiting if i not in inside))
    queue = list(waiting)
    return lpm_order(view, queue) if order == "lpm" else dfs_weight_order(view, queue)
