"""alpha-protection baselines: admission rule, clearing, no-progress detection, conformance."""
import pickle

import numpy as np
import pytest

from kvstudy.engine import Engine
from kvstudy.latency.models import UnitLatency
from kvstudy.policies.base import SchedulerView
from kvstudy.policies.protection import AlphaProtection
from tests.conftest import make_instance


def view(waiting_prompt, running_prompt=(), running_gen=(), capacity=100):
    w = np.arange(len(waiting_prompt))
    r = np.arange(len(running_prompt))
    return SchedulerView(round=0, time=0.0, capacity=capacity, waiting_ids=w, waiting_prompt=np.array(waiting_prompt),
                         waiting_predicted=np.ones(len(w), int), waiting_arrival=np.zeros(len(w)), running_ids=r,
                         running_prompt=np.array(running_prompt, int), running_generated=np.array(running_gen, int),
                         running_predicted=np.ones(len(r), int), running_arrival=np.zeros(len(r)))


def test_admission_stops_at_first_prompt_over_budget():
    p = AlphaProtection(alpha=0.2)
    p.reset(0)
    # budget 80; running uses (10 + 4 + 1) = 15; prompts need s + 1: 21 -> 36, 31 -> 67, 15 -> 83 > 80: stop
    assert p.schedule(view([20, 30, 14, 1], running_prompt=[10], running_gen=[4])).tolist() == [0, 1]


def test_greedy_clears_all_and_beta_clears_a_fraction():
    v = view([], running_prompt=[5] * 1000, running_gen=[1] * 1000, capacity=10_000)
    greedy = AlphaProtection(alpha=0.1)
    greedy.reset(0)
    assert len(greedy.on_overflow(v)) == 1000
    beta = AlphaProtection(alpha=0.1, beta=0.2)
    beta.reset(0)
    n = len(beta.on_overflow(v))
    assert 150 < n < 250


def test_beta_clearing_is_seeded():
    v = view([], running_prompt=[5] * 50, running_gen=[1] * 50, capacity=10_000)
    a, b = AlphaProtection(0.1, 0.3), AlphaProtection(0.1, 0.3)
    a.reset(7)
    b.reset(7)
    assert np.array_equal(a.on_overflow(v), b.on_overflow(v))


def run(policy, prompt, output, capacity, **kw):
    req = make_instance(prompt, output)
    policy.reset(0)
    return Engine(req, req.output_tokens, policy, UnitLatency(), capacity, **kw).run()


def test_too_small_alpha_ends_with_no_progress_status():
    # Two requests that each fit alone but not together at their peaks; alpha = 0 admits both, they
    # overflow, are both cleared, and the same thing repeats forever.
    res = run(AlphaProtection(alpha=0.0), [10, 10], [40, 40], capacity=60, stall_limit=25)
    assert res.status == "no_progress"
    assert res.clearing_events == 25
    assert "25 clearing events in a row" in res.message
    assert (res.requests["restarts"] > 0).all()


def test_overflow_is_recorded_and_costs_a_batch():
    res = run(AlphaProtection(alpha=0.0, beta=0.5), [10, 10], [40, 40], capacity=60, stall_limit=1000)
    it = res.iterations
    assert res.status == "completed"
    assert (it.loc[~it.overflow, "kv_tokens_in_use"] <= 60).all()
    over = it[it.overflow]
    assert len(over) == res.clearing_events > 0 and (over.duration == 1.0).all()
    assert (over.kv_tokens_in_use > 60).all() and (over.cleared == 0).any()  # beta may clear nobody


@pytest.mark.parametrize("beta", [None, 0.3])
def test_conformance_determinism_and_pickling(beta):
    rng = np.random.default_rng(3)
    prompt, output = rng.integers(1, 6, 40), rng.integers(1, 40, 40)
    a = run(AlphaProtection(0.05, beta), prompt, output, capacity=60).requests
    b = run(pickle.loads(pickle.dumps(AlphaProtection(0.05, beta))), prompt, output, capacity=60).requests
    assert a.equals(b)


@pytest.mark.parametrize("seed", range(20))
def test_fcfs_fast_path_equals_general_admission(seed):
    rng = np.random.default_rng(seed)
    waiting = rng.integers(1, 60, rng.integers(0, 300))
    v = view(list(waiting), running_prompt=list(rng.integers(1, 50, 5)), running_gen=list(rng.integers(0, 30, 5)),
             capacity=int(rng.integers(200, 3000)))
    p = AlphaProtection(alpha=float(rng.uniform(0, 0.5)))
    p.reset(0)
    assert np.array_equal(p.schedule(v), p.admit(v, p.order(v)))
