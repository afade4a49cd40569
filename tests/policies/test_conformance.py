"""Every registered policy (each file in conf/policy/) passes the same checks, Gymnasium-style:
it builds from its config, finishes random small instances with valid decisions, is deterministic for a
seed, survives pickling, and keeps no state between runs."""
import copy
import pickle

import numpy as np
import pytest

from kvstudy import api
from kvstudy.engine import Engine
from kvstudy.latency.models import UnitLatency
from kvstudy.policies.base import Policy, SchedulerView
from kvstudy.policies.step import StepPolicy
from tests.compositions import compose_each
from tests.conftest import make_instance
from tests.step_helpers import step_engine

POLICIES = api.options("policy")
#: each policy's composition, made once and shared by the workers (tests/compositions.py)
COMPOSED = {key[0][len("+policy="):]: cfg for key, cfg in compose_each("policies", [[f"+policy={name}"]
                                                                                   for name in POLICIES]).items()}


def build(name):
    return api.build_policy(copy.deepcopy(COMPOSED[name]))


def memories(name):
    """The memory models a policy runs on: preemptive ones on paged memory only; admission-only ones on both (the
    engine adapts them to paged memory, kvstudy/policies/admission.py); a policy that chooses prefix caching
    (memory=paged_prefix: the cache-aware ones) on that."""
    if COMPOSED[name].memory.get("prefix_caching"):
        return ["paged_prefix"]
    return ["paged"] if getattr(build(name), "preemptive", False) else ["paper", "paged"]


CASES = [(name, memory) for name in POLICIES for memory in memories(name)]


def instance(seed):
    rng = np.random.default_rng(seed)
    n = 60
    return make_instance(rng.integers(1, 8, n), rng.integers(1, 40, n), np.sort(rng.uniform(0, 30, n)))


def run(policy, req, seed=0, memory="paged"):
    if memory.startswith("paged"):  # the same 80 tokens in blocks of 4
        return step_engine(req, policy, capacity=80, block_size=4, latency=UnitLatency(), stall_limit=200,
                           seed=seed, prefix_caching=memory == "paged_prefix").run()
    policy.reset(seed)
    return Engine(req, req.output_tokens, policy, UnitLatency(), 80, stall_limit=200).run()


@pytest.mark.parametrize("name,memory", CASES)
def test_builds_and_finishes(name, memory):
    policy = build(name)
    assert isinstance(policy, (Policy, StepPolicy)) and policy.name
    for seed in range(3):
        res = run(policy, instance(seed), memory=memory)
        # clear-all heuristics may legitimately cycle (the paper's "infinite loops"): that must end in a status
        assert res.status in ("completed", "no_progress"), res.message
        if name in ("mcsf", "mc_benchmark", "fcfs_watermark", "vllm", "sarathi"):
            assert res.status == "completed" and (res.requests["state"] == "done").all()
        ok = ~res.iterations["overflow"]
        assert (res.iterations.loc[ok, "kv_tokens_in_use"] <= 80).all()
        if memory.startswith("paged"):
            assert (res.iterations["blocks_used"] <= 20).all()


def assert_deterministic(make, memory):
    """A policy from ``make()`` gives the same run again, after another run, and after a pickle round trip."""
    req = instance(7)
    first = run(make(), req, memory=memory).requests
    policy = make()
    run(policy, instance(8), memory=memory)  # a different run first: nothing may carry over
    assert run(policy, req, memory=memory).requests.equals(first)
    assert run(pickle.loads(pickle.dumps(make())), req, memory=memory).requests.equals(first)


@pytest.mark.parametrize("name,memory", CASES)
def test_deterministic_pickles_and_keeps_no_state(name, memory):
    assert_deterministic(lambda: build(name), memory)


def test_fcfs_watermark_preempts_newest_until_fit():
    policy = build("fcfs_watermark")
    policy.reset(0)
    view = SchedulerView(round=5, time=1.0, capacity=100, waiting_ids=np.empty(0, int),
                         waiting_prompt=np.empty(0, int), waiting_predicted=np.empty(0, int),
                         waiting_arrival=np.empty(0), running_ids=np.array([0, 1, 2, 3]),
                         running_prompt=np.array([30, 30, 30, 30]), running_generated=np.array([4, 3, 2, 1]),
                         running_predicted=np.ones(4, int), running_arrival=np.array([0.0, 1.0, 2.0, 3.0]))
    # need 35 + 34 + 33 + 32 = 134 > 100: evict the newest (32) -> 102 still over, then 33 -> 69 fits
    assert sorted(policy.on_overflow(view).tolist()) == [2, 3]
