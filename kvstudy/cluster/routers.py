"""Routers of a cluster of replicas (issue 37; the ``router`` config group, kvstudy/cluster/driver.py): which
replica a request joins when it arrives. A router reads only what a real load balancer could: each replica's
queue, load, KV in use and (with prefix caching) how much of the request it holds cached.

Vidur's three global schedulers (``vidur/scheduler/global_scheduler/``, vidur 0.0.26), with their semantics:

* ``round_robin``: the k-th request (in arrival order) goes to replica k mod N, whatever the load;
* ``random``: ``random.randint(1, N) - 1`` from Python's generator (Vidur seeds the global one; here a
  ``random.Random(seed)`` of the router's own, so a sweep's runs do not share it);
* ``least_outstanding`` (Vidur's ``lor``): the replica with the fewest requests *waiting* in its queue
  (``num_pending_requests`` is ``len(request_queue)``: running requests do not count), the lowest index on ties
  (``min`` over the replica map in index order).

kvstudy's others (llm-d / BLIS / splitwise-sim style), documented as such:

* ``least_kv``: the replica with the smallest share of its KV blocks in use; ties (replicas with nothing running,
  whose routed requests hold no KV before they start) by fewer outstanding requests, then the lowest index;
* ``power_of_two``: two distinct replicas drawn at random, the one with fewer outstanding requests (waiting +
  running + swapped; the first drawn on ties) (Mitzenmacher's two choices);
* ``prefix_affinity``: among replicas whose outstanding requests exceed the least loaded one's by at most
  ``max_imbalance``, the one holding the longest cached prefix of the request; ties by fewer outstanding requests,
  then lowest index (with ``max_imbalance`` 0 it is least-outstanding with prefix ties broken by the cache).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Dict, Sequence

from kvstudy.config.validate import check_group


@dataclass
class ReplicaLoad:
    """What a router sees of one replica when a request arrives."""

    waiting: int = 0          # requests in its queue, not started (Vidur's num_pending_requests)
    outstanding: int = 0      # requests routed to it and not finished: waiting + running + swapped out
    kv_blocks: int = 0        # KV blocks in use (or reserved)
    num_blocks: int = 1       # KV blocks it has
    cached: Callable[[int], int] = staticmethod(lambda request: 0)  # tokens of request i it holds cached


class Router:
    """``route(i, replicas) -> replica index`` for request i (arrival order), called once per request."""

    name = "router"

    def __init__(self) -> None:
        self.reset(0)  # usable at once; a run resets it with its seed

    def reset(self, seed: int) -> None:
        self._random = random.Random(seed)

    def route(self, i: int, replicas: Sequence[ReplicaLoad]) -> int:
        raise NotImplementedError


class RoundRobin(Router):
    name = "round_robin"

    def reset(self, seed: int) -> None:
        super().reset(seed)
        self._count = 0

    def route(self, i, replicas):
        k = self._count % len(replicas)
        self._count += 1
        return k


class Random(Router):
    name = "random"

    def route(self, i, replicas):
        return self._random.randint(1, len(replicas)) - 1


class LeastOutstanding(Router):
    name = "least_outstanding"

    def route(self, i, replicas):
        return min(range(len(replicas)), key=lambda k: replicas[k].waiting)


class LeastKV(Router):
    name = "least_kv"

    def route(self, i, replicas):
        return min(range(len(replicas)), key=lambda k: (replicas[k].kv_blocks / max(1, replicas[k].num_blocks),
                                                        replicas[k].outstanding, k))


class PowerOfTwo(Router):
    name = "power_of_two"

    def route(self, i, replicas):
        if len(replicas) == 1:
            return 0
        a, b = self._random.sample(range(len(replicas)), 2)
        return b if replicas[b].outstanding < replicas[a].outstanding else a


class PrefixAffinity(Router):
    name = "prefix_affinity"

    def __init__(self, max_imbalance: int = 4) -> None:
        check_group("router", {"_target_": "kvstudy.cluster.routers.PrefixAffinity",
                               "max_imbalance": max_imbalance})  # its bounds: kvstudy/config/schema.py
        self.max_imbalance = max_imbalance
        super().__init__()

    def route(self, i, replicas):
        least = min(r.outstanding for r in replicas)
        allowed = [k for k, r in enumerate(replicas) if r.outstanding <= least + self.max_imbalance]
        return min(allowed, key=lambda k: (-replicas[k].cached(i), replicas[k].outstanding, k))


ROUTERS: Dict[str, type] = {cls.name: cls for cls in (RoundRobin, Random, LeastOutstanding, LeastKV, PowerOfTwo,
                                                      PrefixAffinity)}
