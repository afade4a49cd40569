"""The preemptive engine (memory=paged): hand-worked vLLM and Sarathi schedules, KV invariants on random
instances, the fast path against the request-by-request walk, and one-line errors for bad input."""
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from kvstudy import api
from kvstudy.engine import PolicyError
from kvstudy.errors import ConfigError
from kvstudy.memory import PagedMemory
from kvstudy.cacheopt.policy import CacheOPT
from kvstudy.policies.step import Decision, StepPolicy
from kvstudy.policies.rr_sjf import SJF, RoundRobin, RRSJF
from kvstudy.policies.vllm import VLLM, Sarathi
from kvstudy.costs.swap_models import PcieSwap, VllmBlocksSwap
from tests.conftest import make_instance
from tests.step_helpers import ARCH, HW, Recorder, step_engine


def two_requests():
    # prompts of 4 tokens, 6 output tokens each, in a cache of 4 blocks of 4 tokens (no watermark)
    return make_instance([4, 4], [6, 6])


def test_vllm_recompute_by_hand():
    """Step 0 prefills both (1 block each, first tokens). Step 1: both contexts reach 5 tokens, each takes
    a second block (4 used). Steps 2-4 decode within those blocks. Step 5: both need a third block with
    none free: A walks first, the tail B is preempted (recompute), A takes B's block and produces its
    6th token. Step 6: B is prefilled again over prompt + 5 generated = 9 tokens and produces its 6th."""
    res = step_engine(two_requests(), VLLM()).run()
    q = res.requests
    assert res.status == "completed" and list(q.state) == ["done", "done"]
    assert q.completion_time.tolist() == [6.0, 7.0] and q.ttft.tolist() == [1.0, 1.0]
    assert q.preemptions_recompute.tolist() == [0, 1] and q.restarts.tolist() == [0, 1]
    assert q.recomputed_tokens.tolist() == [0, 8]  # the KV B held: prompt 4 + 5 tokens - the newest
    assert q.preempted_seconds.tolist() == [0.0, 1.0]  # preempted at the start of step 5, back at step 6
    it = res.iterations
    assert it.prefill_tokens.tolist() == [8, 0, 0, 0, 0, 0, 9]
    assert it.decode_tokens.tolist() == [0, 2, 2, 2, 2, 1, 0]
    assert it.blocks_used.tolist() == [2, 4, 4, 4, 4, 3, 3]
    assert (it.blocks_used <= 4).all() and it.cleared.tolist() == [0, 0, 0, 0, 0, 1, 0]


def test_vllm_swap_by_hand():
    """As above, but B is swapped out at step 5 (2 blocks to host) and swapped back in at step 6, before any
    new admission, decoding in the same step; both copies cost the swap model's time."""
    swap = PcieSwap()
    res = step_engine(two_requests(), VLLM(preemption_mode="swap"), swap=swap).run()
    q, it = res.requests, res.iterations
    one_way = swap.seconds(2)
    assert one_way > 0
    assert q.preemptions_swap.tolist() == [0, 1] and q.restarts.tolist() == [0, 0]
    assert q.completion_time[0] == pytest.approx(6.0 + one_way)
    assert q.completion_time[1] == pytest.approx(7.0 + 2 * one_way)
    assert it.swap_seconds.tolist() == pytest.approx([0, 0, 0, 0, 0, one_way, one_way])
    assert it.host_blocks.tolist() == [0, 0, 0, 0, 0, 2, 0] and it.swapped_in.tolist()[-1] == 1
    assert q.swapped_bytes[1] == 2 * 2 * 4 * ARCH.kv_bytes_per_token(1)  # 2 blocks out and back


def test_swap_falls_back_to_recompute_when_host_is_full():
    res = step_engine(two_requests(), VLLM(preemption_mode="swap"), swap_space_gb=0.0).run()
    q = res.requests
    assert q.swap_fallbacks.tolist() == [0, 1] and q.preemptions_recompute.tolist() == [0, 1]
    assert q.preemptions_swap.sum() == 0 and res.status == "completed"


def test_sarathi_chunks_by_hand():
    """A 10-token prompt under a 4-token budget: chunks 4, 4, 2 in steps 0-2 (first token with the last),
    then one decode; the whole prompt's blocks are held from the first chunk."""
    res = step_engine(make_instance([10], [2]), Sarathi(chunk_size=4), capacity=32).run()
    q, it = res.requests, res.iterations
    assert it.prefill_tokens.tolist() == [4, 4, 2, 0] and it.chunk_tokens.tolist() == [4, 4, 0, 0]
    assert q.first_token_time[0] == 3.0 and q.completion_time[0] == 4.0
    assert it.blocks_used.tolist()[0] == 3 and it.blocks_reserved.tolist()[:2] == [2, 1]


def test_sarathi_decodes_first_and_shares_the_budget():
    """A decoding request takes 1 token of the budget; the new prompt gets the remaining 3."""
    req = make_instance([2, 8], [4, 1], arrival=np.array([0.0, 1.5]))
    res = step_engine(req, Sarathi(chunk_size=4), capacity=32).run()
    it = res.iterations
    # step 0: prompt of A (2); step 1: A decodes; B arrives at 1.5, so step 2: A decodes + B's chunk of 3
    assert it.decode_tokens.tolist()[:3] == [0, 1, 1] and it.prefill_tokens.tolist()[:3] == [2, 0, 3]


def test_vllm_watermark_and_rejection():
    # 8 blocks of 4, watermark 25% = 2 blocks: a 28-token prompt (7 blocks) can never be admitted
    req = make_instance([28, 4, 40], [1, 2, 1])
    res = step_engine(req, VLLM(), capacity=32, watermark=0.25).run()
    q = res.requests
    assert q.state.tolist() == ["rejected", "done", "rejected"]
    assert "watermark" in q.reject_reason[0] and "more than the cache" in q.reject_reason[2]
    assert res.message.startswith("2 request(s) rejected")


class ForcedWalk(VLLM):
    """vLLM without the decode_all fast path: every decode named one by one."""

    def step(self, view):
        d = super().step(view)
        if d.decode_all:  # a new Decision: the one returned may be shared (DECODE_ALL)
            preempted = {v for v, _ in d.preempt}
            decode = [i for i in view.running if i not in view.prefilling and i not in preempted] + list(d.swap_in)
            d = Decision(preempt=list(d.preempt), swap_in=list(d.swap_in), prefill=list(d.prefill), decode=decode,
                         reserve=dict(d.reserve))
        return d


POLICIES = [lambda: VLLM(), lambda: VLLM(preemption_mode="swap"), lambda: Sarathi(chunk_size=8),
            lambda: Sarathi(chunk_size=8, preemption_mode="swap"), lambda: VLLM(running_order="arrival", max_num_seqs=3),
            lambda: SJF(preemption_mode="swap", max_num_seqs=4), lambda: RRSJF(preemption_mode="swap", max_num_seqs=4),
            lambda: RoundRobin(steps_before_preemption=2, max_num_seqs=3), lambda: RRSJF(max_num_seqs=5),
            lambda: CacheOPT(token_budget=8), lambda: CacheOPT(token_budget=16, strategy="swap", max_num_seqs=4),
            lambda: CacheOPT(selection="fcfs", padding="rlp", rlp_padding=2, proactive=False, reserve_blocks=0,
                             preemption="fcfs", strategy="recompute"),
            lambda: UnderCacheOPT(token_budget=12, buffer=0, reserve_blocks=2),
            lambda: UnderCacheOPT(token_budget=12, buffer=0, strategy="swap", m=0)]


class UnderCacheOPT(CacheOPT):
    """CacheOPT whose estimates are half the truth: allocations run out, hosts reach their guests' regions."""

    def _estimate(self, view, i):
        return max(1, view.predicted[i] // 2)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(seed=0, which=5, block=1, swap_gb=4.0, watermark=0.0)  # SJF's swap-in once forgot its next token's block
@example(seed=3096, which=7, block=1, swap_gb=0.0, watermark=0.3)  # two requests rejected after preemption: their gaps
@given(seed=st.integers(0, 10_000), which=st.integers(0, len(POLICIES) - 1), block=st.sampled_from([1, 2, 4, 8]),
       swap_gb=st.sampled_from([0.0, 1e-4, 4.0]), watermark=st.sampled_from([0.0, 0.1, 0.3]))
def test_invariants_on_random_instances(seed, which, block, swap_gb, watermark):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 25))
    req = make_instance(rng.integers(1, 20, n), rng.integers(1, 30, n), np.sort(rng.uniform(0, 10, n)))
    policy = Recorder(POLICIES[which]())
    engine = step_engine(req, policy, capacity=64, block_size=block, swap_space_gb=swap_gb, watermark=watermark)
    res = engine.run()
    q, it = res.requests, res.iterations
    assert res.status == "completed", res.message
    assert set(q.state) <= {"done", "rejected"}
    assert (q.loc[q.state == "rejected", "reject_reason"] != "").all()
    assert (it.blocks_used <= engine.memory.num_blocks).all() and (it.blocks_free >= 0).all()
    assert (it.host_blocks <= engine.memory.host_blocks_total).all()
    assert (it.kv_tokens_in_use <= it.blocks_used * block).all()
    done = q[q.state == "done"]
    assert (done.completion_time >= done.first_token_time).all() and (done.ttft > 0).all()
    # the pooled gaps between tokens (B8.11's tail TBT: every gap of every request): o - 1 per finished request,
    # summing to first token -> completion, and those of a request rejected after a preemption (its recompute no
    # longer fits) up to its last token
    lost = [i for i in range(len(q)) if q.state[i] == "rejected" and engine.state.clock.tokens[i] > 0]
    pooled = res.extra["tbt_pooled"]
    gaps = int((done.output_tokens - 1).sum()) + sum(engine.state.clock.tokens[i] - 1 for i in lost)
    assert pooled.get("count", 0) == gaps
    if gaps:
        spans = (done.completion_time - done.first_token_time).sum() + sum(
            engine.state.last_token[i] - engine.state.first_token[i] for i in lost)
        assert pooled["mean"] * gaps == pytest.approx(spans)
        worst = max([done.max_tbt.max()] + [engine.state.max_gap[i] for i in lost])
        assert pooled["max"] == pytest.approx(worst) and pooled["p50"] <= pooled["p99"] <= pooled["max"]
    came_back = {i for i in policy.at_preemption if q.state[i] != "rejected"}
    assert not came_back  # every preempted request came back (or was rejected, with its reason)
    again = step_engine(req, Recorder(POLICIES[which]()), capacity=64, block_size=block, swap_space_gb=swap_gb,
                        watermark=watermark).run()
    assert again.requests.equals(q) and again.iterations.equals(it)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_fast_path_equals_the_walk(mode):
    rng = np.random.default_rng(3)
    req = make_instance(rng.integers(1, 40, 200), rng.integers(1, 80, 200), np.sort(rng.uniform(0, 20, 200)))
    fast = step_engine(req, VLLM(preemption_mode=mode), capacity=256, block_size=8).run()
    walk = step_engine(req, ForcedWalk(preemption_mode=mode), capacity=256, block_size=8).run()
    assert fast.requests["preemptions"].sum() > 10  # the instance does preempt
    assert fast.requests.equals(walk.requests) and fast.iterations.equals(walk.iterations)


def test_vllm_blocks_swap_model_follows_pr_11531():
    m = VllmBlocksSwap()
    assert m.rate_gbps(1) == pytest.approx(1.21) and m.rate_gbps(1250) == pytest.approx(3.11)
    m.bind(ARCH, HW, 16)  # Llama2-70B on 2 GPUs: 16 tokens x 2 x 80 layers x 4 KV heads x 128 x 2 bytes per GPU
    block = 16 * 2 * 80 * 4 * 128 * 2
    assert m.block_bytes == block
    assert m.seconds(100) == pytest.approx(100 * block / (m.rate_gbps(100) * 1e9))
    assert VllmBlocksSwap(kernel="batched").rate_gbps(7) == 12.6


# --- bad input: one line each ---------------------------------------------------------------------------
@pytest.mark.parametrize("kw,match", [({"block_size": 0}, "memory.block_size=0"), ({"block_size": 12}, "power of two"),
                                      ({"swap_space_gb": -1}, "memory.swap_space_gb=-1"),
                                      ({"watermark": 1.5}, "memory.watermark=1.5")])
def test_bad_memory_settings(kw, match):
    with pytest.raises(ConfigError, match=match):
        PagedMemory(1024, **kw)


class Rogue(StepPolicy):
    name = "rogue"

    def __init__(self, decision):
        self.decision = decision

    def step(self, view):
        return self.decision(view)


@pytest.mark.parametrize("decide,match", [
    (lambda v: Decision(preempt=[(1, "recompute")]), "preempts request 1, which is not running"),
    (lambda v: Decision(prefill=[(0, 2), (0, 2)]), "names request 0 twice"),
    (lambda v: Decision(prefill=[(0, 99)]), "prefill chunk of 99 tokens; allowed 1..4"),
    (lambda v: Decision(decode=[0]), "decodes request 0, which is not running"),
    (lambda v: Decision(swap_in=[0]), "not swapped out"),
    (lambda v: Decision(prefill=[(0, 4), (1, 4)], reserve={0: 1000}), "needs .* KV blocks .* more than the 4"),
])
def test_bad_decisions_are_refused(decide, match):
    with pytest.raises(PolicyError, match=match):
        step_engine(two_requests(), Rogue(decide)).run()


def test_mode_the_memory_model_cannot_do():
    class Swapper(VLLM):
        def step(self, view):
            d = super().step(view)
            return Decision(preempt=[(i, "offload") for i, _ in d.preempt], swap_in=d.swap_in, prefill=d.prefill,
                            decode=d.decode, decode_all=d.decode_all, reserve=d.reserve)

    with pytest.raises(PolicyError, match="mode 'offload' is not one memory=paged can do"):
        step_engine(two_requests(), Swapper()).run()


def test_policy_and_memory_must_match():
    with pytest.raises(ConfigError, match="needs memory=paged"):
        api.simulate(api.compose(["+policy=vllm", "memory=paper", "+demand=high", "latency=linear",
                                  "workload.num_requests=5", "engine.progress=false"]))
    # an admission-only policy runs on paged memory through the engine's adapter (tests/policies/test_admission_paged.py)
    with pytest.raises(ConfigError, match="policy.preemption_mode='both'"):
        api.build_policy(api.compose(["+policy=vllm", "policy.preemption_mode=both"]))


def test_a_policy_that_never_runs_anything_ends_with_a_status():
    res = step_engine(two_requests(), Rogue(lambda v: Decision()), stall_limit=5).run()
    assert res.status == "stalled" and "ran no request in 5 iterations" in res.message


@pytest.mark.parametrize("policy", ["vllm", "sarathi"])
def test_cli_runs_paged_policies(policy, tmp_path):
    cfg = api.compose([f"+policy={policy}", "+demand=high", "latency=linear", "workload.num_requests=200",
                       "memory.capacity_tokens=3000", "policy.preemption_mode=swap", "engine.progress=false"])
    summary = api.run(cfg, tmp_path)
    assert summary["status"] == "completed" and summary["completed"] == 200
    assert summary["preemptions_swap"] > 0 and summary["memory"]["num_blocks"] == 187
    run = api.load_run(tmp_path)
    assert {"blocks_used", "host_blocks", "swap_seconds", "chunk_tokens"} <= set(run.iterations.columns)
    assert {"preemptions_swap", "preempted_seconds", "recomputed_tokens", "swapped_bytes"} <= set(run.requests.columns)


def test_sweet_spot_found_in_either_direction():
    from kvstudy.preemption_cost import _describe_spot, fit

    s = np.linspace(16, 8000, 40)
    rec = 1e-4 * s + 0.02  # recompute cheaper above 200 tokens against this swap line
    cost = fit(s, rec, 2e-4 * s + 0.0)
    assert cost.sweet_spot is not None and 150 < cost.sweet_spot < 260
    assert "swap below, recompute above" in _describe_spot(cost, 32000)
