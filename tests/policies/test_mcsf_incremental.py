"""MC-SF and MC-Benchmark decide from an order the engine keeps as requests join and leave the queue, and stop at
the first request that fails eq. (5) (issue 27), with eq. (5)'s check of the running set kept while that set stays
(issue 47): the same decisions as the general path, admit(view, order(view)), which sorts the whole queue and builds
the check afresh every iteration. Checked on single views and on whole runs with noisy predictions, clearing events,
re-queued requests, the Fig. 5 remedy and ties; and the kept check, moved on by some rounds, against one built then."""
import numpy as np
import pytest

from kvstudy.engine import Engine
from kvstudy.latency.models import UnitLatency
from kvstudy.policies.base import SchedulerView
from kvstudy.policies.mcsf import MCSF, MCBenchmark
from tests.conftest import make_instance


class General:
    """The reference: the policy's general path, whole queue ordered each iteration."""

    def __init__(self, policy):
        self.inner = policy
        self.name = policy.name

    def reset(self, seed):
        self.inner.reset(seed)

    def schedule(self, view):
        if view.num_waiting == 0:
            return np.empty(0, dtype=np.int64)
        return self.inner.admit(view, self.inner.order(view))

    def on_overflow(self, view):
        return self.inner.on_overflow(view)


def random_view(rng):
    n_wait, n_run = int(rng.integers(0, 200)), int(rng.integers(0, 30))
    predicted = rng.integers(1, 60, n_wait)
    return SchedulerView(round=int(rng.integers(0, 100)), time=0.0, capacity=int(rng.integers(100, 3000)),
                         waiting_ids=np.arange(n_wait), waiting_prompt=rng.integers(1, 50, n_wait),
                         waiting_predicted=predicted, waiting_arrival=np.sort(rng.integers(0, 20, n_wait)).astype(float),
                         running_ids=np.arange(n_wait, n_wait + n_run), running_prompt=rng.integers(1, 50, n_run),
                         running_generated=rng.integers(0, 20, n_run), running_predicted=rng.integers(1, 60, n_run),
                         running_arrival=np.zeros(n_run))


@pytest.mark.parametrize("cls", [MCSF, MCBenchmark])
@pytest.mark.parametrize("seed", range(30))
def test_schedule_equals_general_admission_on_views(cls, seed):
    rng = np.random.default_rng(seed)
    policy = cls(margin=float(rng.choice([0.0, 0.1, 0.3])))
    policy.reset(0)
    v = random_view(rng)
    assert np.array_equal(policy.schedule(v), General(policy).schedule(v))


def run(policy, req, predicted, capacity, remedy, max_batch=None):
    policy.reset(0)
    return Engine(req, predicted, policy, UnitLatency(), capacity, stall_limit=50,
                  raise_prediction_on_eviction=remedy, max_batch=max_batch).run()


@pytest.mark.parametrize("cls", [MCSF, MCBenchmark])
@pytest.mark.parametrize("seed", range(12))
def test_whole_runs_identical_to_the_general_path(cls, seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(50, 400))
    prompt, output = rng.integers(1, 30, n), rng.integers(1, 80, n)
    arrival = np.sort(rng.integers(0, n // 4, n)).astype(float)  # many ties in arrival time
    req = make_instance(prompt, output, arrival)
    noise = rng.choice([0.0, 0.5])  # with noise, under-predictions overflow and clearing re-queues requests
    predicted = np.maximum(1, np.rint(req.output_tokens * rng.uniform(1 - noise, 1 + noise, n))).astype(np.int64)
    capacity = int(rng.integers(150, 600))
    margin = 0.1 if noise else 0.0
    # a batch cap cuts admissions the walk made (the kept check then loses them at the next step)
    for remedy, cap in ((False, None), (True, None), (False, int(rng.integers(3, 12)))):
        fast = run(cls(margin=margin), req, predicted, capacity, remedy, cap)
        slow = run(General(cls(margin=margin)), req, predicted, capacity, remedy, cap)
        assert fast.status == slow.status and fast.clearing_events == slow.clearing_events
        assert fast.requests.equals(slow.requests)
        assert fast.iterations.equals(slow.iterations)


@pytest.mark.parametrize("seed", range(40))
def test_a_kept_check_moved_on_equals_one_built_then(seed):
    """FutureMemory.shifted(r): the running set r decode rounds later (each w + r, each d - r), as built afresh:
    the same check points, memory at them, terms, and the same answers for candidates."""
    from kvstudy.policies.memory_check import FutureMemory

    rng = np.random.default_rng(seed)
    k = int(rng.integers(0, 40))
    w, d = rng.integers(1, 300, k), rng.integers(-3, 60, k)
    capacity = int(rng.integers(200, 5000))
    base = FutureMemory(capacity, w, d)
    for rounds in (0, 1, 2, 5, 17, 70):
        moved, fresh = base.shifted(rounds), FutureMemory(capacity, w + rounds, d - rounds)
        for name in ("pts", "gained", "mem", "w", "d"):
            assert np.array_equal(getattr(moved, name), getattr(fresh, name)), (rounds, name)
        for _ in range(5):
            cw, cd = int(rng.integers(1, 300)), int(rng.integers(1, 60))
            assert moved.try_add(cw, cd) == fresh.try_add(cw, cd)


@pytest.mark.parametrize("seed", range(40))
def test_a_kept_check_without_some_requests_equals_one_built_for_the_rest(seed):
    """FutureMemory.remove: the requests that left taken out of a check equal a check built for those that stay."""
    from kvstudy.policies.memory_check import FutureMemory

    rng = np.random.default_rng(1000 + seed)
    k = int(rng.integers(1, 40))
    w, d = rng.integers(1, 300, k), rng.integers(1, 30, k)  # few distinct ends: points shared by several requests
    ids = list(range(100, 100 + k))
    check = FutureMemory(10_000, w, d, ids=ids)
    gone = {i for i in ids if rng.random() < 0.4}
    check.remove(gone)
    stay = np.array([i not in gone for i in ids])
    fresh = FutureMemory(10_000, w[stay], d[stay])
    for name in ("pts", "gained", "mem", "w", "d"):
        assert np.array_equal(getattr(check, name), getattr(fresh, name)), name
    assert check.ids == [i for i in ids if i not in gone]
