"""MC-SF and MC-Benchmark: hand-worked schedules, eq. (5) against brute force, memory safety."""
import pickle

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kvstudy.engine import Engine
from kvstudy.latency.models import UnitLatency
from kvstudy.policies.mcsf import MCSF, MCBenchmark
from kvstudy.policies.memory_check import FutureMemory
from tests.conftest import make_instance


def run_unit(policy, prompt, output, arrival=None, capacity=10):
    req = make_instance(prompt, output, arrival)
    policy.reset(0)
    return Engine(req, req.output_tokens, policy, UnitLatency(), capacity).run()


# Worked by hand from eq. (5), M = 10, all at t = 0: A (s=4, o=5), B (s=1, o=2), C (s=1, o=2).
# MC-SF takes B, C in round 0 (A would need 12 at tau=2), A only in round 2 when B, C finish.
# MC-Benchmark takes A, then B (memory 9 at tau=2 and 5), stops at C; C fits only in round 5.
def test_mcsf_hand_worked():
    res = run_unit(MCSF(), [4, 1, 1], [5, 2, 2]).requests
    assert res["first_scheduled_time"].tolist() == [2, 0, 0]
    assert res["completion_time"].tolist() == [7, 2, 2]
    assert res["e2e_latency"].sum() == 11


def test_mc_benchmark_hand_worked():
    res = run_unit(MCBenchmark(), [4, 1, 1], [5, 2, 2]).requests
    assert res["first_scheduled_time"].tolist() == [0, 0, 5]
    assert res["completion_time"].tolist() == [5, 2, 7]
    assert res["e2e_latency"].sum() == 14


def test_unit_convention_completion_is_p_plus_o():
    # one request arriving in round 3 is admitted in round 3 and completes at 3 + o (eq. (1))
    res = run_unit(MCSF(), [2], [4], arrival=np.array([3.0])).requests.iloc[0]
    assert (res.first_scheduled_time, res.completion_time, res.e2e_latency) == (3, 7, 4)


def test_mcsf_ties_by_arrival_then_input_order():
    # equal predictions: the earlier arrival first, then input order; only one fits at a time
    res = run_unit(MCSF(), [5, 5, 5], [4, 4, 4], arrival=np.array([1.0, 0.0, 0.0]), capacity=9).requests
    assert res.sort_values("first_scheduled_time")["request_id"].tolist() == [1, 2, 0]


def brute_force_eq5(capacity, running_w, running_d, new):
    """Eq. (5) over every tau, not just the completion points."""
    ws = list(running_w) + [w for w, _ in new]
    ds = list(running_d) + [d for _, d in new]
    horizon = max([d for d in ds] + [1])
    for tau in range(1, horizon + 1):
        if sum(w + tau for w, d in zip(ws, ds) if d >= tau) > capacity:
            return False
    return True


@settings(max_examples=200, deadline=None)
@given(st.integers(10, 60), st.lists(st.tuples(st.integers(1, 8), st.integers(-2, 15)), max_size=6),
       st.lists(st.tuples(st.integers(1, 8), st.integers(1, 15)), min_size=1, max_size=8))
def test_future_memory_matches_brute_force(capacity, running, candidates):
    rw = np.array([w for w, _ in running], dtype=np.int64)
    rd = np.array([d for _, d in running], dtype=np.int64)
    mem = FutureMemory(capacity, rw, rd)
    accepted = []
    for w, d in candidates:
        expected = brute_force_eq5(capacity, rw[rd >= 1], rd[rd >= 1], accepted + [(w, d)])
        assert mem.try_add(w, d) == expected
        if expected:
            accepted.append((w, d))


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(st.data())
def test_oracle_policies_never_exceed_memory(data):
    capacity = data.draw(st.integers(20, 60))
    n = data.draw(st.integers(1, 25))
    prompt = data.draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    output = [data.draw(st.integers(1, capacity - s)) for s in prompt]
    arrival = np.sort(np.array(data.draw(st.lists(st.integers(0, 30), min_size=n, max_size=n)), dtype=float))
    for policy in (MCSF(), MCBenchmark()):
        result = run_unit(policy, prompt, output, arrival, capacity)
        assert result.status == "completed"
        assert result.clearing_events == 0
        assert (result.iterations["kv_tokens_in_use"] <= capacity).all()
        assert (result.requests["state"] == "done").all()
        # independent recomputation of memory per round from the schedule (constraint (3))
        req = result.requests
        horizon = int(req["completion_time"].max()) + 1
        for t in range(horizon):
            p, s, o = req["first_scheduled_time"], req["prompt_tokens"], req["output_tokens"]
            active = (p < t) & (t <= p + o)
            assert int((s + t - p)[active].sum()) <= capacity


@pytest.mark.parametrize("cls", [MCSF, MCBenchmark])
def test_policy_conformance_determinism_and_pickling(cls):
    rng = np.random.default_rng(1)
    prompt, output = rng.integers(1, 6, 40), rng.integers(1, 30, 40)
    arrival = np.sort(rng.uniform(0, 20, 40))
    a = run_unit(cls(), prompt, output, arrival, capacity=50).requests
    clone = pickle.loads(pickle.dumps(cls()))
    b = run_unit(clone, prompt, output, arrival, capacity=50).requests
    assert a.equals(b)


def test_remedy_raises_an_evicted_requests_prediction_and_ends_the_clearing_cycle():
    """Fig. 5's cycle: MC-SF with a margin under large under-predictions keeps overflowing with the paper's
    literal rule (no_progress); with engine.raise_prediction_on_eviction the same runs complete. The reported
    predictions stay the predictor's."""
    from kvstudy import api
    from kvstudy.errors import KvStudyError

    base = ["+policy=mcsf", "policy.margin=0.1", "predictor=uniform_noise", "predictor.epsilon=0.8", "+demand=high",
            "seed=0", "engine.progress=false"]
    literal, _ = api.simulate(api.compose(base))
    remedy, _ = api.simulate(api.compose(base + ["engine.raise_prediction_on_eviction=true"]))
    assert literal.status == "no_progress" and remedy.status == "completed"
    assert remedy.clearing_events > 0
    assert remedy.requests.predicted_output_tokens.equals(literal.requests.predicted_output_tokens)
    with pytest.raises(KvStudyError, match="engine.raise_prediction_on_eviction='yes'"):
        api.simulate(api.compose(base + ["engine.raise_prediction_on_eviction=yes"]))
