"""CacheOPT's components on hand-worked cases (issue 25's acceptance list): embedding feasibility and the conflict
rule, the allocation cases Sum M = A, < A, > A, the preemption bucket order and swap-or-recompute."""
import numpy as np
import pytest

from kvstudy.cacheopt.allocation import allocate
from kvstudy.cacheopt.embedding import best_host, conflict, feasible, region
from kvstudy.cacheopt.preemption import choose_mode, tbt_bucket, victim_order


def test_embedding_feasibility_best_fit_and_conflict():
    # host: 400 allocated, 100 used; guest: prompt 50, output 60, buffer 8: 400 - 160 - 110 = 130 >= 8
    assert feasible(400, 100, 50, 60, 8)
    assert feasible(278, 100, 50, 60, 8) and not feasible(277, 100, 50, 60, 8)  # 278 - 160 - 110 = 8: the edge
    # three hosts: (a, u) = (400, 100) slack 300, (300, 100) slack 200, (250, 100) does not fit: the best fit is #1
    assert best_host([400, 300, 250], [100, 100, 100], 50, 60, 8) == 1
    assert best_host([200], [100], 50, 60, 8) is None
    assert region(400, 50, 60) == (290, 400)
    assert not conflict(281, 400, 50, 60, 8) and conflict(282, 400, 50, 60, 8)  # 282 + 8 reaches 290


def test_allocation_cases():
    want, base = np.array([100.0, 100.0]), np.array([10.0, 10.0])
    slack, prompt, output = np.array([1.0, 3.0]), np.array([50.0, 50.0]), np.array([50.0, 50.0])
    a, left = allocate(want, base, slack, prompt, output, pool=200)  # Sum M = A
    assert list(a) == [100.0, 100.0] and left == 0.0
    a, left = allocate(want, base, slack, prompt, output, pool=260)  # Sum M < A
    assert list(a) == [100.0, 100.0] and left == 60.0
    a, _ = allocate(want, base, slack, prompt, output, pool=120)  # Sum M > A: cuts E = 80 in proportion to RT s_o
    assert a == pytest.approx([80.0, 40.0])  # lambda = 80 / 200: cuts 20 and 60
    a, _ = allocate(want, base, slack, prompt, output, pool=30)  # a floor binds: water-filling
    assert a == pytest.approx([20.0, 10.0])
    a, _ = allocate(want, base, slack, prompt, output, pool=15)  # not even the floors: the caller preempts first
    assert list(a) == [10.0, 10.0]
    a, _ = allocate(want, base, slack, prompt, output, pool=120, mode="literal")  # A' RT s_p / Sum(RT s_p)
    assert a == pytest.approx([30.0, 90.0])


def test_preemption_bucket_order():
    # (SLO_tbt s, remaining tokens, KV held): loosest SLO bucket first, then longest remaining, then least KV
    slo = [0.1, 0.6, 0.6, 0.6, 0.3]
    remaining = [500, 100, 300, 300, 900]
    kv = [100, 100, 700, 200, 100]
    assert [tbt_bucket(s) for s in slo] == [1, 3, 3, 3, 2]
    assert victim_order(slo, remaining, kv) == [3, 2, 1, 4, 0]


def test_swap_above_the_sweet_spot_else_recompute():
    assert choose_mode(4001, 4000) == "swap" and choose_mode(4000, 4000) == "recompute"
    assert choose_mode(100, None, recompute_s=lambda s: 0.001 * s, swap_s=lambda s: 0.0005 * s) == "swap"


@pytest.mark.parametrize("seed", range(20))
def test_deadline_queue_walks_its_live_requests_in_deadline_order(seed):
    """The queue (kvstudy/cacheopt/queue.py) against a plain dict of live deadlines, through pushes (re-entries with
    earlier deadlines too: ahead of the dead front), drops (the earliest mostly, as starts are), walks and windows."""
    from kvstudy.cacheopt.queue import DeadlineQueue

    rng = np.random.default_rng(seed)
    q, live = DeadlineQueue(), {}
    for step in range(3000):
        r = rng.random()
        if r < 0.45:
            i = int(rng.integers(0, 400))
            deadline = float(rng.integers(0, 50)) + step * 0.1 * rng.random()
            q.push(deadline, i)
            live[i] = deadline
        elif r < 0.85 and live:
            # the earliest deadlines start first (the dead front), sometimes any
            i = min(live, key=lambda j: (live[j], j)) if rng.random() < 0.8 else int(rng.choice(list(live)))
            q.drop(i)
            del live[i]
        else:
            expect = sorted(live, key=lambda j: (live[j], j))
            assert list(q) == expect and len(q) == len(live)
            lo = float(rng.integers(0, 60))
            assert q.window(lo, lo + 10) == [j for j in expect if lo <= live[j] < lo + 10]
