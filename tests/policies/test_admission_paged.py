"""Admission-only policies (MC-SF, MC-Benchmark, alpha-protection, fcfs_watermark) on paged memory through the
engine's adapter (kvstudy/policies/admission.py, issue 34): hand-worked schedules (eq. (5) in blocks; a clearing
event and its cost), and the engine's invariants on random instances, exact and under-predicted."""
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from kvstudy import api
from kvstudy.errors import ConfigError
from kvstudy.policies.admission import Admission
from kvstudy.policies.base import Policy
from kvstudy.policies.mcsf import MCSF, MCBenchmark
from kvstudy.policies.memory_check import BlockFutureMemory
from kvstudy.policies.protection import AlphaProtection, FCFSWatermark
from tests.conftest import make_instance
from tests.step_helpers import Recorder, step_engine


def times(res):
    return res.requests[["first_token_time", "completion_time", "preemptions"]].values.tolist()


def test_mcsf_counts_eq5_in_blocks():
    """A: prompt 4, output 3; B: prompt 4, output 2; both at 0; one-second iterations. In 12 tokens of blocks of 4
    (3 blocks) MC-SF takes B first (shorter); A would need 1 + 1 blocks now but B's and A's first decodes need 2 + 2
    blocks at the next point: 4 > 3, so A waits one iteration, then fits (B's last token is in that iteration, d = 0).
    In blocks of 1 (12 tokens) both fit at once: 5 + 5 tokens at the next point."""
    req = make_instance(np.array([4, 4]), np.array([3, 2]))
    assert times(step_engine(req, MCSF(), capacity=12, block_size=4).run()) == [[2.0, 4.0, 0], [1.0, 2.0, 0]]
    assert times(step_engine(req, MCSF(), capacity=12, block_size=1).run()) == [[1.0, 3.0, 0], [1.0, 2.0, 0]]


@pytest.mark.parametrize("cost,done", [("batch", [8.0, 13.0]), ("free", [7.0, 12.0])])
def test_alpha_greedy_overflow_is_a_clearing_event(cost, done):
    """Two requests of prompt 3, output 7, in 3 blocks of 4 with alpha = 0: each charged ceil(4 / 4) = 1 block x 4
    tokens, both start. At their third token (context 5) both need a second block: 4 > 3, an overflow; alpha-greedy
    clears both (recompute, 2 + 2 - 1 = 4 KV tokens dropped each). Then each restart needs ceil(6 / 4) x 4 = 8 tokens:
    one at a time. ``batch`` charges the event the overflowing batch's second, ``free`` nothing."""
    req = make_instance(np.array([3, 3]), np.array([7, 7]))
    engine = step_engine(req, AlphaProtection(alpha=0.0), capacity=12, block_size=4)
    engine.overflow_cost = cost
    res = engine.run()
    q, it = res.requests, res.iterations
    assert res.status == "completed" and res.clearing_events == 1
    assert q.completion_time.tolist() == done and q.recomputed_tokens.tolist() == [4, 4]
    event = it[it.overflow]
    assert len(event) == 1 and event.cleared.item() == 2 and event.start.item() == 2.0
    assert event.duration.item() == (1.0 if cost == "batch" else 0.0) and event.kv_tokens_in_use.item() == 10


def test_block_future_memory_against_brute_force():
    rng = np.random.default_rng(5)
    for _ in range(300):
        bs = int(rng.choice([1, 2, 4, 16]))
        w, d = rng.integers(1, 60, 6), rng.integers(-2, 12, 6)
        now = int(((w + bs - 1) // bs).sum())
        budget = int(rng.integers(now * bs, now * bs + 200))
        mem = BlockFutureMemory(budget, w, d, bs, now)
        kept = [(int(a), int(b)) for a, b in zip(w, d) if b >= 1]
        added = []
        for _ in range(5):
            cw, cd = int(rng.integers(1, 60)), int(rng.integers(0, 12))
            terms = kept + added + [(cw, cd)]
            ok = now + sum(-(-x // bs) for x, _ in added) + -(-cw // bs) <= budget // bs and all(
                sum(-(-(x + tau) // bs) for x, y in terms if y >= tau) <= budget // bs for tau in range(1, 13))
            assert mem.try_add(cw, cd) == ok
            if ok:
                added.append((cw, cd))


class Lazy(Policy):
    """A new idea written as order + admit, nothing else: the engine adapts it."""

    name = "lazy"

    def order(self, view):
        return np.argsort(view.waiting_prompt, kind="stable")

    def admit(self, view, order):
        room = view.capacity - view.running_kv_tokens
        need = np.cumsum(view.kv_need(view.waiting_prompt[order] + 1))
        return order[: int(np.searchsorted(need, room, side="right"))]


FAMILY = [MCSF, MCBenchmark, lambda: AlphaProtection(alpha=0.3, beta=0.5), FCFSWatermark, Lazy,
          lambda: AlphaProtection(alpha=0.1)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(seed=66, which=2, block=8, under=False)  # alpha-beta never admits a prompt: stalled, named (Recorder-wrapped)
@given(seed=st.integers(0, 10_000), which=st.integers(0, len(FAMILY) - 1), block=st.sampled_from([1, 2, 4, 8]),
       under=st.booleans())
def test_invariants_on_random_instances(seed, which, block, under):
    """Blocks never above capacity, tokens kept across preemption (the engine's Recorder checks), every request done
    or rejected with a reason (a clear-all heuristic may instead cycle: then the run ends no_progress), determinism."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 25))
    req = make_instance(rng.integers(1, 20, n), rng.integers(1, 30, n), np.sort(rng.uniform(0, 10, n)))
    predicted = np.maximum(1, req.output_tokens // 2) if under else None

    def run():
        policy = Recorder(Admission(FAMILY[which]()))
        engine = step_engine(req, policy, capacity=64, block_size=block, predicted=predicted, stall_limit=60)
        return engine, policy, engine.run()

    engine, policy, res = run()
    q, it = res.requests, res.iterations
    assert (it.blocks_used <= engine.memory.num_blocks).all() and (it.blocks_free >= 0).all()
    if res.status == "stalled":  # a protection threshold below a prompt's blocks: it can never start
        assert "admits none of" in res.message and which in (2, 3, 5), res.message
    elif res.status != "completed":  # only a policy that clears on overflow can keep overflowing
        assert res.status == "no_progress" and it.overflow.any(), res.message
    else:
        assert set(q.state) <= {"done", "rejected"}
        assert (q.loc[q.state == "rejected", "reject_reason"] != "").all()
        assert not {i for i in policy.at_preemption if q.state[i] != "rejected"}
        if not under and which in (0, 1):  # exact predictions: eq. (5) never over-commits
            assert not it.overflow.any()
    _, _, again = run()
    assert again.requests.equals(q) and again.iterations.equals(it)


def test_through_the_api_and_refusals():
    base = ["+demand=high", "latency=linear", "workload.num_requests=40", "engine.progress=false", "memory=paged"]
    result, summary = api.simulate(api.compose(["+policy=mcsf"] + base))
    assert result.status == "completed" and "blocks_used" in result.iterations
    with pytest.raises(ConfigError, match="admission=authors_code checks memory in tokens"):
        api.simulate(api.compose(["+policy=mcsf", "policy.admission=authors_code"] + base))
    with pytest.raises(ConfigError, match="raise_prediction_on_eviction=true is the paper loop"):
        api.simulate(api.compose(["+policy=mcsf", "engine.raise_prediction_on_eviction=true"] + base))


@pytest.mark.parametrize("memory", ["paper", "paged"])
def test_the_adapters_token_counts_are_the_engines(memory, monkeypatch):
    """The adapter reads running requests' tokens from the engine's decode count (one array operation, not one call
    per request); on random instances, with overflows and restarts, they equal the engine's own count."""
    from kvstudy.engine import Engine
    from kvstudy.latency.models import UnitLatency
    from kvstudy.policies import admission

    checked = []
    original = admission._View._running_arrays

    def checking(self):
        out = original(self)
        by_engine = [self._sv.generated[i] - 1 for i in self._sv.running]
        assert out["running_generated"].tolist() == by_engine
        checked.append(len(by_engine))
        return out

    monkeypatch.setattr(admission._View, "_running_arrays", checking)
    for seed in range(30):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(5, 30))
        req = make_instance(rng.integers(1, 20, n), rng.integers(1, 30, n), np.sort(rng.uniform(0, 10, n)))
        pred = np.maximum(1, req.output_tokens // 2)  # under-predictions: overflows, evictions
        for make in (MCSF, lambda: AlphaProtection(alpha=0.2, beta=0.5), FCFSWatermark):
            policy = make()
            policy.reset(seed)
            if memory == "paper":
                Engine(req, pred, policy, UnitLatency(), 60, stall_limit=40).run()
            else:
                step_engine(req, policy, capacity=60, block_size=4, predicted=pred, stall_limit=40).run()
    assert sum(checked) > 1000


@pytest.mark.parametrize("memory", ["paper", "paged"])
def test_an_engine_run_twice_gives_the_same_result(memory):
    from kvstudy.engine import Engine
    from kvstudy.latency.models import UnitLatency

    req = make_instance(np.array([5, 3, 7]), np.array([4, 6, 2]), np.array([0.0, 0.5, 1.0]))
    policy = MCSF()
    policy.reset(0)
    engine = Engine(req, req.output_tokens, policy, UnitLatency(), 30) if memory == "paper" else \
        step_engine(req, policy, capacity=32, block_size=4)
    first = engine.run()
    policy.reset(0)
    again = engine.run()
    assert first.status == again.status == "completed" and first.requests.equals(again.requests)


class Returns(Policy):
    name = "returns"

    def __init__(self, value):
        self.value = value

    def order(self, view):
        return np.arange(view.num_waiting)

    def admit(self, view, order):
        return self.value


@pytest.mark.parametrize("value,match", [
    (None, "returned NoneType for its admissions; expected an array or list of positions"),
    ({0: 1}, "returned dict for its admissions"),
    ([0.7], "returned values of type float64 for its admissions"),
    (np.array([True, False]), "returned a boolean mask for its admissions"),
    ([5], "returned admission position 5, outside 0..1"),
    ([0, 0], "returned a admission position twice"),
])
@pytest.mark.parametrize("memory", ["paper", "paged"])
def test_a_bad_admission_answer_is_named_in_one_line(value, match, memory):
    from kvstudy.engine import Engine
    from kvstudy.latency.models import UnitLatency
    from kvstudy.engine.states import PolicyError

    req = make_instance(np.array([2, 2]), np.array([2, 2]))
    policy = Returns(value)
    engine = Engine(req, req.output_tokens, policy, UnitLatency(), 30) if memory == "paper" else \
        step_engine(req, policy, capacity=32, block_size=4)
    with pytest.raises(PolicyError, match=match):
        engine.run()


def test_what_is_not_a_policy_and_what_over_admits_are_named():
    from kvstudy.engine.states import PolicyError

    req = make_instance(np.array([8, 8]), np.array([2, 2]))

    class Neither:
        name = "neither"

        def reset(self, seed):
            pass

    with pytest.raises(PolicyError, match="is neither a step policy"):
        step_engine(req, Neither())
    with pytest.raises(PolicyError, match="admits requests whose prefills need 4 KV blocks with the running requests'"
                                          ", more than the 3 the cache has"):
        step_engine(req, Returns([0, 1]), capacity=12, block_size=4).run()


def test_the_paper_loops_settings_are_refused_on_paged_memory_when_the_engine_is_assembled():
    req = make_instance(np.array([2]), np.array([2]))
    from tests.step_helpers import ARCH, HW
    from kvstudy.memory import PagedMemory
    from kvstudy.engine.assembly import build_engine
    from kvstudy.costs.swap_models import PcieSwap
    from kvstudy.latency.models import UnitLatency

    for kw, match in [({"raise_prediction_on_eviction": True}, "Fig. 5 remedy"), ({"max_batch": 2}, "engine.max_batch=2"),
                      ({"arrivals": "authors_code"}, "engine.arrivals=authors_code"),
                      ({"overflow_cost": "authors_code"}, "engine.overflow_cost=authors_code")]:
        with pytest.raises(ConfigError, match=match):
            build_engine(req, req.output_tokens, MCSF(), UnitLatency(), PagedMemory(32, block_size=4), PcieSwap(),
                         ARCH, HW, **kw)


def test_no_watermark_rejection_for_an_admission_policy():
    """A request that fits the whole cache is never rejected under an admission policy (no vLLM watermark rule):
    25 blocks of 4, watermark 0.1 (vLLM would leave 23 for a prompt); A (4, 93) alone needs 24 blocks at its end."""
    req = make_instance(np.array([4, 4]), np.array([93, 12]), np.array([0.0, 84.0]))
    res = step_engine(req, AlphaProtection(alpha=0.0), capacity=100, block_size=4, watermark=0.1).run()
    assert res.status == "completed" and (res.requests.state == "done").all()
