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
    # the terms are kept sorted by d (ties in the order given), the names with them
    assert check.ids == [i for _, i in sorted((x, i) for x, i in zip(d, ids) if i not in gone)]


@pytest.mark.parametrize("seed", range(40))
def test_a_kept_block_check_moved_on_or_reduced_equals_one_built_then(seed):
    """BlockFutureMemory.shifted(r, now) and .remove (issue 59: MC-SF keeps its check on paged memory too): the same
    points, blocks at them and terms as a check built for the running set then, and the same answers for candidates."""
    from kvstudy.policies.memory_check import BlockFutureMemory

    rng = np.random.default_rng(2000 + seed)
    k, bs = int(rng.integers(0, 40)), int(rng.choice([1, 4, 16]))
    w, d = rng.integers(1, 300, k), rng.integers(-3, 40, k)
    budget, ids = int(rng.integers(200, 8000)), list(range(500, 500 + k))
    base = BlockFutureMemory(budget, w, d, bs, 7, ids=ids)
    for rounds in (0, 1, 2, 5, 17, 70):
        moved, fresh = base.shifted(rounds, 11), BlockFutureMemory(budget, w + rounds, d - rounds, bs, 11)
        for name in ("pts", "mem", "w", "d", "now", "capacity"):
            assert np.array_equal(getattr(moved, name), getattr(fresh, name)), (rounds, name)
        assert moved.ids == [i for x, i in sorted(zip(d - rounds, ids)) if x >= 1]  # sorted by d, ties as given
        for _ in range(5):
            cw, cd = int(rng.integers(1, 300)), int(rng.integers(0, 40))
            assert moved.try_add(cw, cd, -1) == fresh.try_add(cw, cd)
    gone = {i for i in ids if rng.random() < 0.4}
    kept = base.shifted(0, 7)
    kept.remove(gone)
    stay = np.array([i not in gone for i in ids], dtype=bool)
    fresh = BlockFutureMemory(budget, w[stay], d[stay], bs, 7)
    for name in ("pts", "mem", "w", "d"):
        assert np.array_equal(getattr(kept, name), getattr(fresh, name)), name


@pytest.mark.parametrize("overrides", [
    ["+policy=mcsf", "memory=paged", "memory.capacity_tokens=6000"],
    ["+policy=mc_benchmark", "memory=paged", "memory.capacity_tokens=6000", "predictor=gaussian_noise",
     "predictor.sigma=0.6"],
    ["+policy=mcsf_prefix", "workload=shared_prompt", "memory.capacity_tokens=8000", "predictor=gaussian_noise",
     "predictor.sigma=0.6"],
], ids=["mcsf-paged", "mc_benchmark-paged-noisy", "mcsf_prefix-shared-noisy"])
def test_whole_runs_with_the_kept_check_on_paged_memory_equal_fresh_checks(overrides, monkeypatch):
    """The kept check (shifted, reduced, reused while the prefix cache's sharing is unchanged) against the check built
    afresh in every iteration: the same requests and iterations, on paged memory with and without shared blocks."""
    from kvstudy import api
    from kvstudy.policies.mcsf import PrefixFutureMemoryPolicy

    from kvstudy.policies.memory_check import BlockFutureMemory

    cfg = ["+demand=high", "workload.num_requests=400", "latency=linear", "engine.progress=false", *overrides]
    reused, shifted = [], BlockFutureMemory.shifted
    monkeypatch.setattr(BlockFutureMemory, "shifted", lambda self, *a: reused.append(1) or shifted(self, *a))
    kept, _ = api.simulate(api.compose(cfg))
    assert len(reused) > 100  # the kept check was used, not rebuilt every time
    monkeypatch.setattr(PrefixFutureMemoryPolicy, "_memory", lambda self, view, budget: (
        self._build_memory(view, budget), None))
    fresh, _ = api.simulate(api.compose(cfg))
    assert kept.requests.equals(fresh.requests) and kept.iterations.equals(fresh.iterations)



def test_memory_over_capacity_after_a_candidates_end_admits_nobody():
    """A check over capacity at a point past the candidate's end (110 > 105 at tau = 100) refuses it, though memory up
    to its end would hold it: a cheaper check that looks only up to the candidate's end must keep this."""
    from kvstudy.policies.memory_check import FutureMemory

    assert not FutureMemory(105, np.array([10]), np.array([100])).try_add(1, 1)
    assert FutureMemory(110, np.array([10]), np.array([100])).try_add(1, 1)


@pytest.mark.parametrize("paged", [False, True], ids=["tokens", "blocks"])
@pytest.mark.parametrize("seed", range(30))
def test_a_remembered_refusal_answers_as_a_fresh_check_rounds_later(paged, seed):
    """try_add remembers how many rounds a refused candidate stays refused while the check is only moved on (issue 59
    item 2): the same candidate asked again, some rounds later, gets the answer of a check built then (near the
    bound: refusals by a few tokens or blocks, points close to their end)."""
    from kvstudy.policies.memory_check import BlockFutureMemory, FutureMemory

    rng = np.random.default_rng(3000 + seed)
    k, bs = int(rng.integers(1, 30)), int(rng.choice([1, 4, 16]))
    w, d = rng.integers(1, 200, k), rng.integers(1, 25, k)
    if paged:
        budget = int(rng.integers(500, 3000))
        build = lambda w_, d_: BlockFutureMemory(budget, w_, d_, bs, 0)  # noqa: E731
    else:
        capacity = int(rng.integers(300, 3000))
        build = lambda w_, d_: FutureMemory(capacity, w_, d_)  # noqa: E731
    candidates = [(int(rng.integers(1, 400)), int(rng.integers(1, 30))) for _ in range(12)]
    asked = 0
    for cw, cd in candidates:
        base = build(w, d)
        if base.try_add(cw, cd):
            continue  # only refusals are remembered
        check, total = base, 0
        for step in rng.integers(0, 4, 12):
            check, total = (check.shifted(int(step)) if not paged else check.shifted(int(step), 0)), total + int(step)
            assert check.try_add(cw, cd) == build(w + total, d - total).try_add(cw, cd), (cw, cd, total)
            asked += 1
            if not check._refused:
                break  # accepted: the check changed
    assert asked or all(build(w, d).try_add(cw, cd) for cw, cd in candidates)
