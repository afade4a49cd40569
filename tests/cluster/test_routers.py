"""kvstudy/cluster/routers.py (issue 37, started): each router's choices by hand on tiny instances, and Vidur's
semantics where it has the router."""
import random

import pytest

from kvstudy.cluster.routers import ROUTERS, LeastKV, LeastOutstanding, PowerOfTwo, PrefixAffinity, Random, \
    ReplicaLoad, RoundRobin
from kvstudy.errors import ConfigError


def loads(*waiting, outstanding=None, kv=None, cached=None):
    n = len(waiting)
    outstanding = outstanding or [0] * n
    kv = kv or [0] * n
    cached = cached or [{}] * n
    return [ReplicaLoad(waiting=w, outstanding=o, kv_blocks=b, num_blocks=100, cached=lambda i, c=c: c.get(i, 0))
            for w, o, b, c in zip(waiting, outstanding, kv, cached)]


def test_round_robin_ignores_load():
    r = RoundRobin()
    r.reset(0)
    assert [r.route(i, loads(9, 0, 0)) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_random_draws_as_vidur_does_from_its_own_seeded_generator():
    r = Random()
    r.reset(5)
    got = [r.route(i, loads(0, 0, 0, 0)) for i in range(20)]
    stream = random.Random(5)
    assert got == [stream.randint(1, 4) - 1 for _ in range(20)]
    r.reset(5)
    assert [r.route(i, loads(0, 0, 0, 0)) for i in range(20)] == got  # determinism


def test_least_outstanding_counts_waiting_requests_only_and_breaks_ties_by_index():
    r = LeastOutstanding()
    r.reset(0)
    assert r.route(0, loads(3, 1, 1, 2, outstanding=[3, 50, 9, 2])) == 1  # Vidur's lor: queue length, not running
    assert r.route(0, loads(2, 2, 5)) == 0


def test_least_kv_uses_the_share_of_blocks_in_use():
    state = loads(0, 0, 0, kv=[50, 20, 20])
    state[2].num_blocks = 10  # 20 of 10: over-full
    r = LeastKV()
    r.reset(0)
    assert r.route(0, state) == 1
    assert r.route(0, loads(0, 0, 0, outstanding=[2, 1, 1])) == 1  # nothing in use anywhere: fewer outstanding


def test_power_of_two_takes_the_less_loaded_of_two_draws():
    r = PowerOfTwo()
    r.reset(3)
    state = loads(0, 0, 0, 0, outstanding=[4, 1, 7, 2])
    draws = random.Random(3)
    for _ in range(30):
        a, b = draws.sample(range(4), 2)
        expected = b if state[b].outstanding < state[a].outstanding else a
        assert r.route(0, state) == expected
    assert r.route(0, loads(5)) == 0


def test_prefix_affinity_prefers_the_cache_within_the_load_bound():
    state = loads(0, 0, 0, outstanding=[3, 9, 4], cached=[{7: 512}, {7: 4096}, {7: 1024}])
    assert PrefixAffinity(max_imbalance=10).route(7, state) == 1  # the longest cached prefix, load within bound
    assert PrefixAffinity(max_imbalance=2).route(7, state) == 2  # replica 1 is too loaded: the next longest
    assert PrefixAffinity(max_imbalance=0).route(7, state) == 0  # only the least loaded
    assert PrefixAffinity(max_imbalance=10).route(8, state) == 0  # nothing cached anywhere: least loaded
    with pytest.raises(ConfigError, match="router.max_imbalance"):
        PrefixAffinity(max_imbalance=-1)


def test_one_replica_always_gets_everything():
    for name, cls in ROUTERS.items():
        r = cls()
        r.reset(0)
        assert [r.route(i, loads(i)) for i in range(5)] == [0] * 5, name


def test_every_router_config_is_a_registered_router_that_passes_the_same_checks():
    """Each conf/router/*.yaml composes and builds (api.build_router), names its class's ``name``, routes every
    request of a random load to a replica that exists, gives the same choices after the same reset, and pickles
    (a sweep's worker may receive it)."""
    import pickle

    import numpy as np

    from kvstudy import api
    from kvstudy.running.paths import CONF_DIR

    names = sorted(p.stem for p in (CONF_DIR / "router").glob("*.yaml"))
    assert names == sorted(ROUTERS)
    rng = np.random.default_rng(0)
    for name in names:
        cfg = api.compose(["+policy=vllm", f"router={name}"])
        router = api.build_router(cfg)
        assert type(router) is ROUTERS[name] and router.name == name == cfg.router.name
        states = [loads(*rng.integers(0, 9, 5).tolist(), outstanding=rng.integers(0, 9, 5).tolist(),
                        kv=rng.integers(0, 100, 5).tolist()) for _ in range(40)]
        router.reset(7)
        first = [router.route(i, s) for i, s in enumerate(states)]
        assert all(isinstance(k, int) and 0 <= k < 5 for k in first), name
        router.reset(7)
        clone = pickle.loads(pickle.dumps(router))
        assert [router.route(i, s) for i, s in enumerate(states)] == first, name
        assert [clone.route(i, s) for i, s in enumerate(states)] == first, name
