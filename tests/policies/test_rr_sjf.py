"""RR-SJF and its baselines (paper 001): hand-worked schedules, the quantum, noise isolation, the workload."""
import numpy as np
import pandas as pd
import pytest

from kvstudy import api
from kvstudy.errors import ConfigError, DataError
from kvstudy.policies.rr_sjf import SJF, QueuedVLLM, RoundRobin, RRSJF
from kvstudy.policies.step import StepPolicy
from kvstudy.costs.predictors import gaussian_noise
from kvstudy.workloads import arena
from tests.conftest import make_instance, needs_shared
from tests.step_helpers import step_engine


def fig1():
    """The paper's Fig. 1: four requests at t = 0 (arrival order 1, 2, 3, 4), job lengths ascending 2, 4, 3, 1;
    one request runs at a time (max_num_seqs = 1), quantum 5 steps, every iteration 1 s."""
    return make_instance([4, 4, 4, 4], [12, 3, 8, 6])


@pytest.mark.parametrize("policy,first_token,completion", [
    # Derived by hand from spec A2.2/A2.3 (see each policy's docstring); token times are iteration ends.
    # FCFS: to completion in arrival order.
    (QueuedVLLM(max_num_seqs=1), [1, 13, 16, 24], [12, 15, 23, 29]),
    # SJF (vLLM priority): request 1 starts (the first step admits in arrival order), is preempted at step 1
    # by the inversion (12 > 3), then 2, 4, 3 run to completion and 1 resumes (recompute of 4 + 1 tokens).
    (SJF(max_num_seqs=1), [1, 2, 11, 5], [29, 4, 18, 10]),
    # RR: 1 runs 5 steps and goes to the back; 2 completes; 3, 4, 1 take 5-step turns in FIFO order; then
    # 3 and 4 finish, 1 last. A preemption step runs no batch and takes no time.
    (RoundRobin(max_num_seqs=1), [1, 6, 9, 14], [29, 8, 26, 27]),
    # RR-SJF: as RR for the first quantum (arrival order at step 0), then waiting sorted by (-steps waited,
    # prediction): 2, 4, 3, 1 (the paper's order), 2 completes, 4, 3, 1 take turns, 4 and 3 finish, 1 last.
    (RRSJF(max_num_seqs=1), [1, 6, 14, 9], [29, 8, 27, 24]),
])
def test_fig1_schedules_by_hand(policy, first_token, completion):
    res = step_engine(fig1(), policy, capacity=4096, block_size=16).run()
    q = res.requests
    assert res.status == "completed", res.message
    assert q.first_token_time.tolist() == first_token
    assert q.completion_time.tolist() == completion


class QuantumCheck(StepPolicy):
    """Wraps a round-robin policy: with memory to spare, every preemption must come after the quantum."""

    def __init__(self, inner):
        self.inner, self.name, self.violations, self.preemptions = inner, inner.name, [], 0

    def reset(self, seed):
        self.inner.reset(seed)

    def step(self, view):
        d = self.inner.step(view)
        for i, _ in d.preempt:
            self.preemptions += 1
            if self.inner.running_for(view, i) < self.inner.quantum:
                self.violations.append((view.step, i))
        return d


@pytest.mark.parametrize("cls", [RoundRobin, RRSJF])
@pytest.mark.parametrize("quantum,unit", [(1, "steps"), (5, "steps"), (7, "tokens")])
def test_quantum_is_honoured(cls, quantum, unit):
    rng = np.random.default_rng(1)
    req = make_instance(rng.integers(1, 30, 60), rng.integers(1, 60, 60), np.sort(rng.uniform(0, 5, 60)))
    check = QuantumCheck(cls(steps_before_preemption=quantum, quantum_unit=unit, max_num_seqs=4))
    res = step_engine(req, check, capacity=1 << 16, block_size=16).run()
    assert res.status == "completed" and (res.requests.state == "done").all()
    assert check.preemptions > 10 and not check.violations


def test_noise_never_reaches_the_true_lengths():
    req = make_instance([8] * 200, np.arange(1, 201))
    noisy = gaussian_noise(req, np.random.default_rng(0), sigma=150)
    assert not np.array_equal(noisy, req.output_tokens) and noisy.min() >= 1 and noisy.max() <= 1024
    policy = RRSJF(max_num_seqs=8)
    policy.reset(0)
    from tests.step_helpers import ARCH, HW, ONE_SECOND
    from kvstudy.memory import PagedMemory
    from kvstudy.engine.loop import StepEngine
    from kvstudy.costs.swap_models import PcieSwap

    res = StepEngine(req, noisy, policy, ONE_SECOND, PagedMemory(1 << 16), PcieSwap(), ARCH, HW).run()
    q = res.requests
    assert (q.output_tokens == np.arange(1, 201)).all() and (q.predicted_output_tokens == noisy).all()
    # a request ends exactly when its true length is reached: its last token is its o-th
    assert (q.state == "done").all()
    assert np.allclose(q.mean_tbt[q.output_tokens > 1] * (q.output_tokens[q.output_tokens > 1] - 1),
                       (q.completion_time - q.first_token_time)[q.output_tokens > 1])


def test_gaussian_noise_clamps_and_is_seeded():
    req = make_instance([4] * 5, [1, 10, 500, 1024, 2000])
    assert gaussian_noise(req, np.random.default_rng(0), sigma=0).tolist() == [1, 10, 500, 1024, 1024]
    a = gaussian_noise(req, np.random.default_rng(3), sigma=50, low=15, high=1025)
    assert a.min() >= 15 and a.max() <= 1025
    assert (a == gaussian_noise(req, np.random.default_rng(3), sigma=50, low=15, high=1025)).all()


def test_arena_workload_matches_the_papers_mix():
    df = arena.arena()
    assert len(df) == 1000 and (df.output_tokens == 1024).sum() == 500
    short = df.output_tokens[df.output_tokens < 1024]
    assert short.median() == 42 and 100 < short.mean() < 110  # spec A4: 43 / 105 counting BOS
    assert df.prompt_tokens.median() == 16 and 35 < df.prompt_tokens.mean() < 40


@needs_shared
def test_shipped_arena_rows_rebuild_from_the_shared_table(tmp_path):
    from kvstudy.running.paths import SHARED_REFERENCE

    rebuilt = arena.select(pd.read_csv(SHARED_REFERENCE / "traces-extra" / "arena_llama32_1b_lengths.csv"))
    assert rebuilt.equals(pd.read_csv(arena.SHIPPED))


@pytest.mark.parametrize("override,match", [
    ("policy.steps_before_preemption=0", "policy.steps_before_preemption=0: allowed a whole number >= 1"),
    ("policy.steps_before_preemption=-3", "policy.steps_before_preemption=-3: allowed a whole number >= 1"),
    ("policy.quantum_unit=seconds", "policy.quantum_unit='seconds'"),
])
def test_bad_policy_settings(override, match):
    with pytest.raises(ConfigError, match=match):
        api.build_policy(api.compose(["+policy=rr_sjf", override]))


def test_bad_noise_and_rate():
    req = make_instance([4], [10])
    with pytest.raises(ConfigError, match="predictor.sigma=-1"):
        gaussian_noise(req, np.random.default_rng(0), sigma=-1)
    cfg = api.compose(["+policy=rr_sjf", "workload=arena", "+demand=high", "demand.rate=0", "latency=linear"])
    with pytest.raises(ConfigError, match="demand.rate=0"):
        api.simulate(cfg)


def test_arena_file_without_its_columns(tmp_path):
    bad = tmp_path / "lengths.csv"
    pd.DataFrame({"prompt_chars": [40], "tokens": [10]}).to_csv(bad, index=False)
    with pytest.raises(DataError, match=r"lacks column\(s\) \['source', 'index', 'output_tokens'\]"):
        arena.arena(path=str(bad))


@pytest.mark.parametrize("policy", ["fcfs", "sjf", "rr", "rr_sjf"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_policies_run_the_arena_burst(policy, mode):
    cfg = api.compose([f"+policy={policy}", "workload=arena", "workload.num_requests=200", "+demand=offline",
                       "latency=linear", "memory.capacity_tokens=20000", f"policy.preemption_mode={mode}",
                       "policy.max_num_seqs=32", "engine.progress=false"])
    res, summary = api.simulate(cfg)
    assert summary["status"] == "completed" and summary["completed"] == 200
    if policy in ("rr", "rr_sjf"):
        assert summary["preemptions"] > 0


@pytest.mark.parametrize("rule", ["boundary", "vllm"])
def test_sjf_victim_when_nothing_waits(rule):
    # Issue 33, item 8. Two requests at t=0, prompt 2, output 2, predicted 2 (A) and 1 (B); 3 blocks of 2 tokens;
    # unit time. t=0: both prefill (a block each, first token). t=1: nothing waits, so no admission; vLLM's
    # priority routine sorts running to [B, A]; both decodes cross a block boundary and one block is free: B takes
    # it, A (the tail, the longest prediction) is preempted. B is done at 2; A recomputes (3 tokens, 2 blocks) at 2
    # and is done at 3. Sorting only while something waits preempted B instead.
    req = make_instance([2, 2], [2, 2])
    res = step_engine(req, SJF(), predicted=np.array([2, 1]), capacity=6, block_size=2,
                      decode_block_check=rule).run()
    assert res.requests.completion_time.tolist() == [3.0, 2.0]
    assert res.requests.preemptions.tolist() == [1, 0]
