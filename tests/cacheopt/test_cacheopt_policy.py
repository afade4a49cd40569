"""CacheOPT as a step policy (kvstudy/cacheopt/policy.py) on hand-worked schedules, with the engine's loans.

The schedules use the test engine's 1 s iterations, blocks of 4 tokens, exact predictions (the error ranges are
empty, so the padding is 0 and s_o = X^) and per-request SLOs set by hand, so every number below can be followed
on paper.
"""
import numpy as np
import pytest

from kvstudy import api
from kvstudy.cacheopt import setup
from kvstudy.engine import PolicyError
from kvstudy.errors import ConfigError
from kvstudy.memory import PagedMemory
from kvstudy.cacheopt.policy import CacheOPT
from kvstudy.policies.step import Decision, StepPolicy
from kvstudy.preemption_cost import PreemptionCost
from tests.conftest import make_instance
from tests.step_helpers import step_engine


class Tape(StepPolicy):
    """Records each step's decision (a copy) and what the view showed."""

    def __init__(self, inner):
        self.inner, self.name, self.log = inner, inner.name, []
        self.prepare = inner.prepare

    @property
    def slo_tft(self):  # prepared already: the test helper leaves the SLOs alone
        return self.inner.slo_tft

    def reset(self, seed):
        self.inner.reset(seed)
        self.log = []

    def step(self, view):
        d = self.inner.step(view)
        self.log.append((view.time, list(view.running), {i: view.memory.held(i) for i in view.running},
                         Decision(list(d.preempt), list(d.swap_in), list(d.prefill), list(d.decode), d.decode_all,
                                  dict(d.reserve), list(d.lend))))
        return d

    def at(self, t):
        return [entry for entry in self.log if entry[0] == t][0]


def run(policy, req, slo_tft, slo_tbt, capacity=32, block=4, ranges=None, cost=None, **kw):
    policy.prepare(slo_tft, slo_tbt, ranges or {}, cost)
    tape = Tape(policy)
    res = step_engine(req, tape, capacity=capacity, block_size=block, **kw).run()
    return tape, res


def two_and_a_late_one():
    # A and B (prompt 8, output 20) at t = 0; C (prompt 8, output 4) at t = 2
    return make_instance([8, 8, 8], [20, 20, 4], np.array([0.0, 0.0, 2.0]))


def quiet(**kw):
    base = dict(token_budget=64, embedding=False, proactive=False, reserve_blocks=0, strategy="recompute")
    return CacheOPT(**{**base, **kw})


def test_allocation_cuts_then_a_critical_arrival_preempts_the_loosest_tbt():
    # t = 0: A and B want M = 8 + 20 = 28 tokens each, 56 > the 32 of the pool: Sum M > A'. The floors are s_p + B =
    # 12; equal slack and s_o give equal cuts of 12: 16 tokens = 4 blocks each (B8.5).
    # t = 2: C's TTFT slack is 0.5 s < T_max (1 s) + epsilon: critical. It needs s_p + B = 12 tokens = 3 blocks; none
    # is free, so one running request is preempted: A, whose TBT SLO (1.0 s) is in the loosest bucket.
    tape, res = run(quiet(), two_and_a_late_one(), [10.0, 10.0, 0.5], [1.0, 0.1, 1.0])
    d0 = tape.at(0.0)[3]
    assert d0.prefill == [(0, 8), (1, 8)] and d0.reserve == {0: 16, 1: 16}
    d2 = tape.at(2.0)[3]
    assert d2.preempt == [(0, "recompute")] and d2.prefill == [(2, 8)] and d2.reserve == {2: 12}
    assert res.status == "completed" and (res.requests.state == "done").all()


def test_critical_waiting_requests_are_new_ones_racing_their_ttft():
    # Issue 33, item 1, on the schedule above. C runs from t = 2 (prefill, first token at 3) and is done at 6. A waits
    # to recompute with a token already out: its TBT slack (1.0 s - time since its last token) is below T_max + eps
    # from t = 3 on. Sec. 3.3's N_w holds only waiting requests racing their TTFT SLO, so A is not critical and waits
    # for KV (first_token): it restarts at 6 with 10 tokens, cut to 16; at 9 B (TBT SLO 0.1 s) runs out of its
    # allocation, is critical, and preempts A (loosest TBT SLO) again; A finishes at 35, B at 20, C at 6.
    tape, res = run(quiet(), two_and_a_late_one(), [10.0, 10.0, 0.5], [1.0, 0.1, 1.0])
    assert tape.inner.causes == {"critical_waiting": 1, "returned": 1}
    assert tape.at(6.0)[3].prefill == [(0, 10)] and tape.at(9.0)[3].preempt == [(0, "recompute")]
    assert res.requests.completion_time.tolist() == [35.0, 20.0, 6.0]
    assert res.requests.preemptions.tolist() == [2, 0, 0]
    # kvstudy's reading before issue 33 (critical_waiting=any): A is critical at 3 and preempts C, C preempts A at 4,
    # and so on, one preemption per iteration until C finishes at 9
    tape, res = run(quiet(critical_waiting="any"), two_and_a_late_one(), [10.0, 10.0, 0.5], [1.0, 0.1, 1.0])
    assert tape.inner.causes == {"critical_waiting": 7}
    assert [e[0] for e in tape.log if e[3].preempt] == [2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert res.requests.completion_time.tolist() == [35.0, 20.0, 9.0]
    assert res.requests.preemptions.tolist() == [4, 0, 3]


def test_a_cut_request_uses_the_kv_a_running_request_releases_in_time():
    # Issue 33, item 3 (step 10's link). 8 blocks of 4. A (prompt 4, output 4: M = 8, 2 blocks) runs from t = 0 and
    # finishes at 4. B (prompt 8, output 20: M = 28) arrives at 1: the pool is 6 blocks, so its allocation is cut to
    # 24 tokens, 4 short. B exhausts its 24 after 24 - 8 = 16 tokens; A releases its 2 blocks (>= the 1 block
    # missing) after 4 - 1 = 3 more: B is linked to A. At 4 A is done and B takes the block first (reserve 28), so C
    # (prompt 4, output 4, arriving at 4, TTFT SLO 30 s) finds 1 block, not the 2 it needs, and waits for B (done at
    # 21). Without the link (link=false) C takes A's blocks at 4 and B draws from free KV when it runs out.
    req = make_instance([4, 8, 4], [4, 20, 4], np.array([0.0, 1.0, 4.0]))
    tape, res = run(quiet(), req, [10.0, 10.0, 30.0], [100.0, 100.0, 100.0])
    assert tape.at(1.0)[3].reserve == {1: 24}
    d4 = tape.at(4.0)[3]
    assert d4.reserve == {1: 28} and not d4.prefill and not tape.inner._links
    assert res.requests.first_token_time.tolist() == [1.0, 2.0, 22.0]
    assert res.requests.completion_time.tolist() == [4.0, 21.0, 25.0]
    tape, res = run(quiet(link=False), req, [10.0, 10.0, 30.0], [100.0, 100.0, 100.0])
    assert tape.at(4.0)[3].prefill == [(2, 4)] and tape.at(4.0)[3].reserve == {2: 8}
    assert res.requests.completion_time.tolist() == [4.0, 21.0, 8.0]


def test_a_link_lapses_when_its_partner_is_preempted():
    # 8 blocks of 4, a reserve of 1. A (prompt 6, output 11) runs from 0 holding 20 tokens; C (prompt 2, output 17)
    # arrives at 6 and is cut to 8 tokens (2 blocks), linked to A. At 9 B (TTFT SLO 5 s, critical) preempts A: A's
    # KV goes to B, so the link lapses and C gets nothing at 10 (serving it then took the last free block and the
    # reserve); the schedule is the one without links (found by an independent review's fuzzing)
    req = make_instance([6, 7, 2], [11, 18, 17], np.array([0.0, 5.0, 6.0]))
    out = {}
    for link in (True, False):
        tape, res = run(quiet(link=link, reserve_blocks=1), req, [1.0, 5.0, 3.0], [4.0, 1.0, 2.0])
        assert tape.at(9.0)[3].preempt == [(0, "recompute")] and not tape.inner._links
        out[link] = [(e[0], e[3].reserve) for e in tape.log if e[3].reserve]
        out[link, "done"] = res.requests.completion_time.tolist()
    assert out[True] == out[False] and out[True, "done"] == [29.0, 27.0, 33.0]


def test_t_max_counts_iterations_not_idle_time():
    # Issue 33, item 4: A (prompt 4, output 2) runs 0-2; the engine idles until B arrives at 10. T_I^max stays 1 s
    # (the test engine's iteration), not the 8 s of idle time; so B, with a TTFT SLO of 5 s, is not critical on
    # arrival (with the idle gap counted it would be: 5 < 8)
    req = make_instance([4, 4], [2, 2], np.array([0.0, 10.0]))
    tape, res = run(quiet(), req, [5.0, 5.0], [100.0, 100.0])
    assert tape.inner._t_max == 1.0
    assert res.requests.completion_time.tolist() == [2.0, 12.0]


def test_fcfs_preemption_takes_the_latest_admitted_instead():
    tape, _ = run(quiet(preemption="fcfs"), two_and_a_late_one(), [10.0, 10.0, 0.5], [1.0, 0.1, 1.0])
    assert tape.at(2.0)[3].preempt == [(1, "recompute")]  # /PP: B, admitted after A


def test_a_request_with_slack_waits_instead():
    tape, _ = run(quiet(), two_and_a_late_one(), [10.0, 10.0, 5.0], [1.0, 0.1, 1.0])
    assert not tape.at(2.0)[3].preempt and not tape.at(2.0)[3].prefill  # RT = 5 s: not critical, no free block


def test_strategy_selection_swaps_above_the_sweet_spot():
    cost = PreemptionCost(0, 1.0, 1.0, 0.0, 0.5, 5.0, sweet_spot=9.0, fit_mape_pct={})
    # A's context at t = 2 is 8 + 2 = 10 tokens (its prefill's token and one decode) > 9: swapped (B2.7); with the
    # spot at 10 it is recomputed
    tape, _ = run(quiet(strategy="select"), two_and_a_late_one(), [10.0, 10.0, 0.5], [1.0, 0.1, 1.0], cost=cost)
    assert tape.at(2.0)[3].preempt == [(0, "swap")]
    cost.sweet_spot = 10.0
    tape, _ = run(quiet(strategy="select"), two_and_a_late_one(), [10.0, 10.0, 0.5], [1.0, 0.1, 1.0], cost=cost)
    assert tape.at(2.0)[3].preempt == [(0, "recompute")]


def test_global_reserve_keeps_running_requests_going_and_new_ones_out():
    # 8 blocks of 4, a reserve of 2 (held back only while something runs). Request 0 (prompt 4, output 12, estimated
    # 8: M = 12) starts alone at t = 0 with 3 blocks. Request 1 (prompt 8, output 20: M = 28) joins at t = 1: the pool
    # is 5 - 2 = 3 blocks, so it gets 3 (its floor s_p + B = 12 tokens); without the reserve (/GR) it gets all 5.
    # Request 2 (prompt 4, output 2) at t = 2 finds the pool empty either way and waits. With the reserve, 0 and 1
    # take its blocks when they run out and keep decoding.
    class Short(CacheOPT):
        def _estimate(self, view, i):
            return 8 if i == 0 else view.predicted[i]

    req = make_instance([4, 8, 4], [12, 20, 2], np.array([0.0, 0.5, 2.0]))
    for reserve, blocks in ((2, 3), (0, 5)):
        policy = Short(token_budget=64, embedding=False, proactive=False, reserve_blocks=reserve, strategy="recompute")
        tape, res = run(policy, req, [10.0, 10.0, 10.0], [100.0, 100.0, 100.0])
        assert tape.at(0.0)[3].reserve == {0: 12}
        assert tape.at(2.0)[2] == {0: 3, 1: blocks} and not tape.at(2.0)[3].prefill
        assert res.status == "completed" and (res.requests.state == "done").all()
        if reserve:  # request 1 took its 4th block from the reserve while 0 still ran and 2 waited
            assert [e for e in tape.log if e[2].get(1) == 4 and 0 in e[1] and 2 not in e[1]]


def test_proactive_allocation_tops_up_a_cut_allocation_before_it_runs_out():
    # 8 blocks. A (prompt 8, output 20) and B (prompt 8, output 2 but estimated 20) both want 28 tokens: cut to 16
    # (4 blocks) each. B finishes at t = 2 and frees its 4 blocks. A (a = 16) reaches u = 14 after 6 tokens: within
    # m = 2 of its allocation, so it is topped up towards M = 28 (7 blocks) before it runs out.
    class Wrong(CacheOPT):
        def _estimate(self, view, i):
            return 20

    req = make_instance([8, 8], [20, 2])
    for proactive in (True, False):
        policy = Wrong(token_budget=64, embedding=False, proactive=proactive, m=2, reserve_blocks=0,
                       strategy="recompute")
        tape, res = run(policy, req, [10.0, 10.0], [5.0, 5.0])
        assert tape.at(0.0)[3].reserve == {0: 16, 1: 16}
        top_ups = [(e[0], e[3].reserve) for e in tape.log if e[3].reserve and not e[3].prefill]
        assert top_ups == ([(6.0, {0: 28})] if proactive else [])
        assert res.status == "completed"


def test_embedding_lends_a_hosts_unused_blocks_and_the_conflict_rule_preempts_the_guest():
    # host H (prompt 4, predicted 60 but truly 60) holds M = 64 tokens = 16 blocks of 64; at t = 1 guest G (prompt 4,
    # output 4) arrives: a_H - (u_H + s_o) - (s_p + s_o) = 64 - (5 + 4) - 8 = 47 >= b = 8: it borrows 2 blocks.
    req = make_instance([4, 4], [60, 4], np.array([0.0, 1.0]))
    policy = CacheOPT(token_budget=64, embedding=True, buffer=8, proactive=False, reserve_blocks=0, strategy="recompute")
    tape, res = run(policy, req, [10.0, 10.0], [5.0, 5.0], capacity=64)
    d1 = tape.at(1.0)[3]
    assert d1.lend == [(1, 0, 2)] and d1.prefill == [(1, 4)] and 1 not in d1.reserve
    assert tape.inner.embedded == 1 and res.status == "completed" and (res.requests.state == "done").all()
    # the loan went back: after G finished, H holds all 16 blocks again
    after = [e for e in tape.log if e[0] > 5.0 and 1 not in e[1]]
    assert after and after[0][2][0] == 16


def test_conflict_rule_preempts_a_guest_when_the_host_grows_into_it():
    # 12 blocks of 4. Host H (prompt 4, output 40, estimated 30: M = 34, 9 blocks) starts at t = 0. Guest G (prompt 4,
    # output 30, estimated 4) arrives at t = 1: 36 - (5 + 4) - (4 + 4) = 19 >= b = 0, so it borrows 2 blocks and H
    # holds 7 (28 tokens). G outgrows its 2 blocks and takes the 3 free ones as it goes, then stalls (TBT SLO 100 s:
    # not critical). At 28 tokens H needs a block, none is free and its guest still runs: the guest is preempted.
    class Est(CacheOPT):
        def _estimate(self, view, i):
            return 30 if i == 0 else 4

    req = make_instance([4, 4], [40, 30], np.array([0.0, 1.0]))
    policy = Est(token_budget=64, embedding=True, buffer=0, proactive=False, reserve_blocks=0, strategy="recompute")
    tape, res = run(policy, req, [10.0, 10.0], [0.01, 100.0], capacity=48)
    assert tape.at(0.0)[3].reserve == {0: 36} and tape.at(1.0)[3].lend == [(1, 0, 2)]
    conflict = [e for e in tape.log if e[3].preempt]
    assert conflict[0][3].preempt == [(1, "recompute")] and conflict[0][2][0] == 7
    assert policy.causes["conflict"] == 1
    assert res.status == "completed" and (res.requests.state == "done").all()


def test_adaptive_confidence_follows_eq_4():
    policy = quiet(padding="confidence", adaptive=True, alpha=0.9, beta=0.5, rate_window=10.0)
    req = make_instance([4] * 4, [4] * 4, np.array([0.0, 1.0, 2.0, 3.0]))
    tape, _ = run(policy, req, [10.0] * 4, [5.0] * 4)
    # request k sees k + 1 arrivals over min(10, its arrival) s (the first: over the window): 0.1, 2, 1.5, 4/3 req/s
    lam = [1 / 10.0, 2 / 1.0, 3 / 2.0, 4 / 3.0]
    assert policy.confidences == pytest.approx([0.9 / (1 + 0.5 * x) for x in lam])


# --- the engine's loans -------------------------------------------------------------------------------------------
def test_memory_loans_go_back_to_the_host_or_stay_with_the_guest():
    mem = PagedMemory(64, block_size=4, watermark=0.0)
    mem.bind(1)
    mem.hold(0, 10)
    mem.lend(0, 1, 3)
    assert (mem.held(0), mem.held(1), mem.used) == (7, 3, 10)
    mem.release(1)  # the guest finishes: its blocks are the host's again
    assert (mem.held(0), mem.used, mem.loans) == (10, 10, {})
    mem.lend(0, 2, 4)
    mem.release(0)  # the host leaves first: the guest keeps its blocks
    assert (mem.held(2), mem.used, mem.loans) == (4, 4, {})
    mem.hold(3, 6)
    mem.lend(3, 4, 2)
    mem.swap_out(4)  # a swapped guest's KV goes to the host memory; the loan's blocks stay with the host
    assert (mem.held(3), mem.host[4], mem.used) == (6, 2, 10)


class Lender(StepPolicy):
    name = "lender"

    def __init__(self, lend):
        self.lend = lend

    def step(self, view):
        if not view.running:
            return Decision(prefill=[(0, 4)], reserve={0: 40})
        if view.waiting:
            return Decision(prefill=[(1, 4)], lend=[(1, 0, self.lend)], decode_all=True)
        return Decision(decode_all=True)


@pytest.mark.parametrize("blocks,match", [(0, "the guest needs at least its context's blocks"),
                                          (10, "the host keeps")])
def test_engine_refuses_a_loan_that_does_not_fit(blocks, match):
    req = make_instance([4, 4], [8, 2], np.array([0.0, 0.5]))
    with pytest.raises(PolicyError, match=match):
        step_engine(req, Lender(blocks), capacity=64, block_size=4).run()


def test_engine_carries_out_a_valid_loan():
    req = make_instance([4, 4], [8, 2], np.array([0.0, 0.5]))
    res = step_engine(req, Lender(2), capacity=40, block_size=4).run()
    assert res.status == "completed" and (res.requests.state == "done").all()


# --- configuration --------------------------------------------------------------------------------------------------
ABLATIONS = {"cka": {"padding": "fixed"}, "rsa": {"selection": "fcfs", "padding": "rlp"},
             "pa": {"proactive": False}, "gr": {"reserve_blocks": 0}, "pp": {"preemption": "fcfs"},
             "pss": {"strategy": "recompute"}}


@pytest.mark.parametrize("which", sorted(ABLATIONS))
def test_each_ablation_switches_off_exactly_its_component(which):
    full = api.compose(["+policy=cacheopt"]).policy
    variant = api.compose([f"+policy=cacheopt_wo_{which}"]).policy
    changed = {k for k in full if k != "name" and full[k] != variant[k]}
    assert changed == set(ABLATIONS[which])
    assert all(variant[k] == v for k, v in ABLATIONS[which].items())


@pytest.mark.parametrize("override,match", [("policy.padding=big", "policy.padding='big'"),
                                            ("policy.confidence=1.0", "policy.confidence=1.0"),
                                            ("policy.adaptive=true policy.alpha=8", "alpha=8"),
                                            ("policy.m=-1", "policy.m=-1")])
def test_bad_settings_are_named(override, match):
    with pytest.raises(ConfigError, match=match):
        api.build_policy(api.compose(["+policy=cacheopt"] + override.split()))


def test_cacheopt_cannot_be_its_own_slo_reference():
    cfg = api.compose(["+policy=cacheopt", "+demand=high", "workload.num_requests=50", "policy.slo.reference=[vllm,cacheopt]"])
    with pytest.raises(ConfigError, match="cannot be its own SLO reference"):
        setup.slo_reference(api.run_context(cfg, latency=False), api.build_policy(cfg))


def test_step_without_slos_is_a_clear_error():
    with pytest.raises(ConfigError, match="needs per-request SLOs"):
        CacheOPT().step(None)
