"""Decode runs (issue 47, kvstudy/engine/loop.py ``_decode_run``): the decode-only iterations a policy promises to
repeat (``steady_spare``) are advanced without asking it, and every result is what asking it at each step gives,
bit for bit; Vidur's tables answer a run of decode-only iterations with the values of its one-iteration lookups."""
import numpy as np
import pandas as pd
import pytest

from kvstudy import api
from kvstudy.running import assemble
from kvstudy.errors import OutOfRangeError
from kvstudy.latency.models import LinearLatency
from kvstudy.latency.tables import VidurTables
from kvstudy.policies.reserving import ReservingPolicy
from kvstudy.policies.rr_sjf import RoundRobin
from kvstudy.policies.step import StepPolicy, StepView
from kvstudy.policies.vllm import VLLM, Sarathi
from tests.conftest import make_instance
from tests.step_helpers import step_engine

FAST = ["engine.progress=false", "+demand=high", "workload.num_requests=300"]
SETTINGS = {
    "vllm": ["+policy=vllm", "memory=paged", "latency=linear"],
    "vllm_vidur": ["+policy=vllm", "memory=paged", "latency=vidur"],  # the vectorised lookups
    "sarathi_vidur": ["+policy=sarathi", "memory=paged", "latency=vidur"],
    "vllm_swap_boundary": ["+policy=vllm", "memory=paged", "latency=linear", "policy.preemption_mode=swap",
                           "memory.decode_block_check=boundary"],
    "vllm_arrival_order": ["+policy=vllm", "memory=paged", "latency=vidur", "policy.running_order=arrival",
                           "policy.max_num_seqs=16"],
    "sarathi_prefix": ["+policy=sarathi", "workload=shared_prompt", "memory=paged_prefix", "latency=linear"],
    "vllm_cluster": ["+policy=vllm", "memory=paged", "latency=vidur", "cluster.replicas=3", "router=least_kv"],
    "vllm_cut_short": ["+policy=vllm", "memory=paged", "latency=vidur", "engine.max_iterations=777"],
}


class Counting:
    """Counts the steps a policy is asked (an instance attribute: the class's ``step``, which the promise names,
    stays the policy's own)."""

    def __init__(self, policy):
        self.asked = 0
        inner = policy.step

        def step(view):
            self.asked += 1
            return inner(view)

        policy.step = step


def _run(overrides, monkeypatch, runs: bool):
    with monkeypatch.context() as m:
        counters = []
        build = assemble.build_policy

        def counted(cfg):
            policy = build(cfg)
            counters.append(Counting(policy))
            return policy

        m.setattr("kvstudy.running.assemble.build_policy", counted)
        if not runs:  # no promise: the engine asks the policy before every iteration
            m.setattr(VLLM, "steady_spare", StepPolicy.steady_spare)
        result, summary = api.simulate(api.compose(overrides + FAST))
    return result, sum(c.asked for c in counters)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_decode_runs_change_no_result(name, monkeypatch):
    with_runs, asked = _run(SETTINGS[name], monkeypatch, runs=True)
    step_by_step, asked_each = _run(SETTINGS[name], monkeypatch, runs=False)
    pd.testing.assert_frame_equal(with_runs.requests, step_by_step.requests)
    pd.testing.assert_frame_equal(with_runs.iterations, step_by_step.iterations)
    assert with_runs.status == step_by_step.status
    assert len(with_runs.iterations) > 100
    assert 0 < asked < asked_each  # the runs asked the policy less often


@pytest.mark.parametrize("policy", [VLLM, Sarathi])
@pytest.mark.parametrize("check", ["vllm", "boundary"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_runs_stop_where_the_policy_would_decide_otherwise(policy, check, mode):
    """Small random instances in a tight memory (12 to 48 blocks), so that runs meet every way the policy's decision
    changes: a block missing at a boundary, vLLM's one free block at each decode's turn when nobody grows (a run that
    ignored it changes 265 of these 1,200 cases), arrivals, completions, preemptions and swaps."""
    latency = LinearLatency(d0=0.1, d1=0.01)
    for seed in range(60):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(1, 25))
        req = make_instance(rng.integers(1, 20, n), rng.integers(1, 40, n), np.sort(rng.uniform(0, 10, n)))
        kw = dict(capacity=48, block_size=int(rng.choice([1, 2, 4])), decode_block_check=check, latency=latency)
        runs = step_engine(req, policy(preemption_mode=mode), **kw).run()
        each = policy(preemption_mode=mode)
        each.steady_spare = lambda view: None
        each = step_engine(req, each, **kw).run()
        assert runs.iterations.equals(each.iterations) and runs.requests.equals(each.requests), seed


def test_only_vllm_and_sarathi_own_steps_promise():
    engine = step_engine(make_instance([4], [4]), VLLM(), decode_block_check="vllm")
    engine._begin()
    view = StepView(engine, 0, 0.0)
    assert VLLM().steady_spare(view) == 1 and Sarathi().steady_spare(view) == 1  # one block spare at each turn
    engine = step_engine(make_instance([4], [4]), VLLM(), decode_block_check="boundary")
    engine._begin()
    assert VLLM().steady_spare(StepView(engine, 0, 0.0)) == 0
    # subclasses that change the step make no promise they did not write
    assert RoundRobin().steady_spare(view) is None and ReservingPolicy().steady_spare(view) is None
    assert StepPolicy().steady_spare(view) is None


def _tables(decode_cols=40, overhead=0.1, stages=2):
    rng = np.random.default_rng(1)
    return VidurTables(per_token_ms=rng.uniform(0.1, 1.0, 4097), decode_ms=rng.uniform(0.01, 0.5, (257, decode_cols)),
                       prefill_ms=rng.uniform(0.1, 1.0, (decode_cols, 129)), send_recv_ms=rng.uniform(0, 0.1, 4097),
                       layers_per_stage=40, stages=stages, kv_granularity=64, decode_overhead=overhead)


@pytest.mark.parametrize("stages", [1, 2])
def test_vidur_decode_runs_are_the_one_iteration_lookups(stages):
    tables = _tables(stages=stages)
    rng = np.random.default_rng(2)
    for _ in range(200):
        n = int(rng.integers(1, 257))
        ctx = int(rng.integers(n, n * 2000))
        count = int(rng.integers(1, 200))
        run = tables.decode_run_seconds(n, ctx, count)
        assert run == [tables.iteration_seconds((), n, ctx + k * n) for k in range(len(run))]
        if len(run) < count:  # stopped before the first iteration out of the trained range, which raises
            with pytest.raises(OutOfRangeError):
                tables.iteration_seconds((), n, ctx + len(run) * n)
    assert tables.decode_run_seconds(300, 300 * 100, 5) == []  # a batch beyond the table: asked one by one
