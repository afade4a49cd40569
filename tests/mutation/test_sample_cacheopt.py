"""Behaviour tests for the CacheOPT mutants that survived issue 55's sampled mutation run (kvstudy/cacheopt/).

Each test pins one rule of CacheOPT (docs/cacheopt.md; Shen et al.) on a hand-worked instance. The schedules use
the test engine's 1 s iterations (tests/step_helpers.py), blocks of 4 tokens unless said, exact predictions (empty
error ranges: no padding, s_o = X^) and SLOs set by hand, so every number can be followed on paper. Times are the
steps' clock: a request arriving at t = 4.5 is first seen by the step at t = 5. ``quiet`` switches off embedding,
proactive top-ups and the global reserve unless a test turns them on.
"""
import warnings

import numpy as np
import pandas as pd
import pytest

from kvstudy import api
from kvstudy.cacheopt import setup, slo, study, workloads
from kvstudy.cacheopt.allocation import allocate
from kvstudy.cacheopt.policy import CacheOPT
from kvstudy.errors import ConfigError
from kvstudy.running import assemble
from tests.cacheopt.test_cacheopt_policy import Tape as CacheoptTape
from tests.conftest import make_instance
from tests.step_helpers import step_engine


class Tape(CacheoptTape):
    """tests/cacheopt/test_cacheopt_policy.py's recorder of each step's decision; ``at(t)``: the decision at t."""

    def at(self, t):
        return [e[3] for e in self.log if e[0] == t][0]


def run(policy, req, slo_tft, slo_tbt, capacity=32, block=4, **kw):
    policy.prepare(slo_tft, slo_tbt, {}, None)
    tape = Tape(policy)
    res = step_engine(req, tape, capacity=capacity, block_size=block, **kw).run()
    return tape, res


def quiet(**kw):
    base = dict(token_budget=64, embedding=False, proactive=False, reserve_blocks=0, strategy="recompute")
    return CacheOPT(**{**base, **kw})


def embedder(**kw):
    return CacheOPT(**{**dict(token_budget=64, embedding=True, buffer=8, proactive=False, reserve_blocks=0,
                              strategy="recompute"), **kw})


# --- allocation (kvstudy/cacheopt/allocation.py): the sums are numpy's -------------------------------------------
# kills kvstudy/cacheopt/allocation.py:35:29 core/ReplaceBinaryOperator_Add_Mul #2
# kills kvstudy/cacheopt/allocation.py:37:29 core/ReplaceBinaryOperator_Add_FloorDiv #5
def test_wants_that_fit_are_granted_whole_with_the_rest_left_over():
    """Sum M < A': everyone gets M_i and the leftover is A' - Sum M. 16 requests wanting 1..16 tokens sum to 136:
    with a pool of 200 the leftover is 64. Eight requests of 1 token each in a pool of 10 leave 2."""
    want = [float(k) for k in range(1, 17)]
    alloc, left = allocate(want, [0.0] * 16, [1.0] * 16, [1.0] * 16, [1.0] * 16, 200.0)
    assert alloc == want and left == 64.0
    alloc, left = allocate([1.0] * 8, [0.0] * 8, [1.0] * 8, [1.0] * 8, [1.0] * 8, 10.0)
    assert alloc == [1.0] * 8 and left == 2.0


# kills kvstudy/cacheopt/allocation.py:43:13 core/ReplaceBinaryOperator_Mod_FloorDiv #1
# kills kvstudy/cacheopt/allocation.py:44:27 core/ReplaceBinaryOperator_Add_LShift #12
# kills kvstudy/cacheopt/allocation.py:44:48 core/ReplaceBinaryOperator_Sub_BitOr #1
@pytest.mark.parametrize("seed", [1, 3])
def test_a_pool_of_exactly_numpys_sum_is_the_case_sum_m_equals_a(seed):
    """Sum M = A' (allocation.py's first case): everyone gets M_i, nothing is left. The sum is numpy's pairwise sum
    (``np.add.reduce``, blocks of 128, split at a multiple of 8), so a pool set to numpy's sum of 300 random wants
    is exactly the total: no cut, leftover exactly 0.0 (another summation order differs in the last bits for these
    seeds, and a cut or a leftover of ~1e-12 follows)."""
    want = list(np.random.default_rng(seed).random(300) * 100)
    pool = float(np.add.reduce(np.array(want)))
    alloc, left = allocate(want, [0.0] * 300, [1.0] * 300, [1.0] * 300, [1.0] * 300, pool)
    assert alloc == want and left == 0.0


# --- estimates (Sec. 3.2) -------------------------------------------------------------------------------------------
def _estimates(policy, predicted, ranges=None):
    req = make_instance([4], [2])
    policy.prepare([10.0], [100.0], ranges or {}, None)
    step_engine(req, policy, capacity=32, block_size=4, predicted=np.array([predicted])).run()
    return policy.estimates()


# kills kvstudy/cacheopt/policy.py:163:48 core/ReplaceBinaryOperator_Mul_FloorDiv #0
def test_fixed_padding_adds_ten_percent():
    """/CKA (padding=fixed): s_o = round(1.1 X^): a prediction of 20 tokens becomes 22 (not 20 // 1.1 = 18)."""
    assert _estimates(quiet(padding="fixed"), 20) == [22]


# kills kvstudy/cacheopt/policy.py:150:28 core/NumberReplacer #43
def test_error_ranges_are_looked_up_in_50_token_bins():
    """Spec B8.2: the range (b - a) is per 50-token bin of X^. X^ = 99 is in bin 1 (50..99), whose range is 0: no
    padding, s_o = 99; bin 2 (100..149) has range 10, which would pad by k(0.9) 10 = 10.7 to 110. X^ = 100 is in
    bin 2: s_o = round(100 + 10.73) = 111."""
    ranges = {(1, 1): 0.0, (2, 1): 10.0}
    assert _estimates(quiet(), 99, ranges) == [99]
    assert _estimates(quiet(), 100, ranges) == [111]


# --- defaults ---------------------------------------------------------------------------------------------------------
# kills kvstudy/cacheopt/policy.py:74:59 core/ReplaceTrueWithFalse #1
def test_embedding_is_on_by_default():
    """CacheOPT embeds by default (Sec. 3.3.1). 16 blocks of 4: host H (prompt 4, output 60) holds all 64 tokens
    from t = 0; guest G (prompt 4, output 4) arrives at 0.5. At t = 1 H's unused allocation is 64 - 5 = 59 >= s_p +
    2 s_o + b = 4 + 8 + 8 = 20: G borrows ceil(8 / 4) = 2 of H's blocks, with ``embedding`` left at its default."""
    req = make_instance([4, 4], [60, 4], np.array([0.0, 0.5]))
    policy = CacheOPT(token_budget=64, buffer=8, proactive=False, reserve_blocks=0, strategy="recompute")
    tape, res = run(policy, req, [10.0, 10.0], [5.0, 5.0], capacity=64)
    assert tape.at(1.0).lend == [(1, 0, 2)] and res.status == "completed"


# kills kvstudy/cacheopt/policy.py:585:66 core/ReplaceBinaryOperator_FloorDiv_BitOr #9
def test_the_reserve_is_at_most_half_the_blocks():
    """The global reserve is min(reserve_blocks, num_blocks // 2). 12 blocks of 4, reserve_blocks = 8: the reserve
    is 6. A (prompt 4, output 8: M = 12, 3 blocks) starts alone at 0 (no reserve while nothing runs). B (prompt 4,
    output 4: M = 8, 2 blocks) arrives at 0.5: at t = 1 the pool is 12 - 3 - 6 = 3 blocks >= 2, so B starts (with
    a reserve of all 8 blocks the pool would be 1 block and B would wait for A to finish at 8)."""
    req = make_instance([4, 4], [8, 4], np.array([0.0, 0.5]))
    tape, res = run(quiet(reserve_blocks=8), req, [10.0, 10.0], [100.0, 100.0], capacity=48)
    assert tape.at(1.0).prefill == [(1, 4)] and tape.at(1.0).reserve == {1: 8}
    assert res.requests.completion_time.tolist() == [8.0, 5.0]


# kills kvstudy/cacheopt/policy.py:135:21 core/NumberReplacer #34
def test_the_deadline_queue_is_kept_without_rebuilds():
    """The waiting queue is kept incrementally (cacheopt/queue.py): every arrival enters it once, from the first
    request on, so it never disagrees with the engine's lists and is never rebuilt (``queue_rebuilds`` stays 0), on
    the schedule of test_the_reserve_is_at_most_half_the_blocks (a request waiting at t = 0 and one arriving later)."""
    req = make_instance([4, 4], [8, 4], np.array([0.0, 0.5]))
    tape, res = run(quiet(), req, [10.0, 10.0], [100.0, 100.0], capacity=48)
    assert res.status == "completed" and tape.inner.queue_rebuilds == 0


# --- step 1: returned requests -----------------------------------------------------------------------------------
# kills kvstudy/cacheopt/policy.py:254:35 core/ReplaceOrWithAnd #3
def test_a_request_preempted_for_another_returned_one_takes_no_block():
    """10 blocks. R, V, X (prompts 4, 8, 4; outputs 20; TTFT SLO 10 s) start at 0 and want 24, 28, 24 tokens:
    76 > 40, equal weights (slack 10 x s_o 20), equal cuts of 12: 12, 16, 12 tokens = 3, 4, 3 blocks, the pool is
    full. All three use up their allocation at t = 9 (8 tokens each). In slack order (TBT SLOs 0.1, 0.9, 1.0: all
    critical, RT_tbt - T_max < eps) R preempts V (loosest bucket, first in order) and takes 1 of V's 4 blocks; V,
    now a victim, takes nothing; X takes 1. D (prompt 4, output 2, arrived at 8.5, not critical) finds 2 free
    blocks = its floor s_p + B = 8 tokens, and starts at 9."""
    req = make_instance([4, 8, 4, 4], [20, 20, 20, 2], np.array([0.0, 0.0, 0.0, 8.5]))
    tape, res = run(quiet(), req, [10.0] * 4, [0.1, 0.9, 1.0, 100.0], capacity=40)
    assert tape.at(0.0).reserve == {0: 12, 1: 16, 2: 12}
    d9 = tape.at(9.0)
    assert d9.preempt == [(1, "recompute")] and d9.prefill == [(3, 4)] and d9.reserve == {3: 8}
    assert res.requests.completion_time.tolist()[3] == 11.0


# kills kvstudy/cacheopt/policy.py:349:58 core/ReplaceAndWithOr #12
def test_liveness_lets_the_most_urgent_stalled_request_go_ahead():
    """6 blocks. A and B (prompt 4, output 20: M = 24 each, 48 > 24) start at 0 cut to 12 tokens (3 blocks) each:
    the pool is full. At t = 9 both reach 12 tokens of context, need a block and find none; TBT SLO 100 s: neither
    is critical, both are late and would stall, and nothing else would run: the liveness rule [D] lets A (equal
    slack, lower index) go ahead by preempting B. A decodes at 9 (it does not stall), so it finishes at 20 (its 20
    tokens: 1 at t = 1, then one per iteration), and B restarts at 20 and finishes at 31."""
    req = make_instance([4, 4], [20, 20])
    tape, res = run(quiet(), req, [10.0, 10.0], [100.0, 100.0], capacity=24)
    d9 = tape.at(9.0)
    assert d9.preempt == [(1, "recompute")] and d9.decode_all
    assert tape.inner.causes == {"liveness": 1} and tape.inner.stalls == 0
    assert res.requests.completion_time.tolist() == [20.0, 31.0]


# --- victims (Sec. 3.4) -------------------------------------------------------------------------------------------
# kills kvstudy/cacheopt/policy.py:213:42 core/ReplaceBinaryOperator_Mul_RShift #1
def test_least_kv_is_preempted_first_among_equals():
    """Blocks of 16, 12 blocks. Big (prompt 120, output 10) holds 9 blocks = 144 tokens (KV bucket 1 of 128
    tokens); Small (prompt 20, output 20) holds 3 blocks = 48 tokens (bucket 0). Same TBT SLO (100 s) and both with
    under 128 tokens left to generate: the KV bucket decides, least first. C (prompt 4, TTFT SLO 0.5 s) arrives at
    1.5 and is critical at 2: it needs 2 blocks, none is free: Small is preempted (its 3 blocks suffice), not Big."""
    req = make_instance([120, 20, 4], [10, 20, 4], np.array([0.0, 0.0, 1.5]))
    tape, res = run(quiet(), req, [10.0, 10.0, 0.5], [100.0, 100.0, 100.0], capacity=192, block=16)
    assert tape.at(1.0).reserve == {1: 48}
    d2 = tape.at(2.0)
    assert d2.preempt == [(1, "recompute")] and (2, 4) in d2.prefill
    assert res.status == "completed"


# --- step 3: critical waiting requests -------------------------------------------------------------------------
# kills kvstudy/cacheopt/policy.py:451:23 core/NumberReplacer #143
def test_critical_admissions_respect_max_num_seqs():
    """max_num_seqs = 2. A (prompt 4, output 10) runs from 0. B and C (prompt 4, output 4, TTFT SLO 0.5 s) arrive at
    1.5 and are both critical at 2; memory is plentiful. B starts (2 running), C does not: it waits for B to finish
    at 6 and starts then."""
    req = make_instance([4, 4, 4], [10, 4, 4], np.array([0.0, 1.5, 1.5]))
    tape, res = run(quiet(max_num_seqs=2), req, [10.0, 0.5, 0.5], [100.0] * 3, capacity=64)
    assert tape.at(2.0).prefill == [(1, 4)] and tape.at(6.0).prefill == [(2, 4)]
    assert res.requests.completion_time.tolist() == [10.0, 6.0, 10.0]


# kills kvstudy/cacheopt/policy.py:433:22 core/ReplaceBinaryOperator_Sub_BitXor #28
def test_a_started_prefill_uses_up_its_chunk_of_the_token_budget():
    """Token budget 20, 13 blocks of 4. At t = 0: A (prompt 8, output 4, TTFT SLO 0.0005 s: critical) starts first
    with s_p + B = 12 tokens (3 blocks) and takes 8 of the budget: 12 left. D (prompt 16, output 12: M = 28) takes
    the remaining 12 (its chunk is cut to 12) and the budget is gone, so E (prompt 8) is not a candidate this step.
    D alone wants 28 <= the pool of 10 blocks: it gets all 28 (with E also a candidate, 28 + 16 > 40 would cut D)."""
    req = make_instance([8, 16, 8], [4, 12, 8])
    tape, res = run(quiet(token_budget=20), req, [0.0005, 10.0, 10.0], [100.0] * 3, capacity=52)
    d0 = tape.at(0.0)
    assert d0.prefill == [(0, 8), (1, 12)] and d0.reserve == {0: 12, 1: 28}
    assert tape.at(1.0).prefill == [(1, 4), (2, 8)]


# --- embedding (Sec. 3.3.1) -----------------------------------------------------------------------------------------
# kills kvstudy/cacheopt/policy.py:407:56 core/ReplaceBinaryOperator_Add_Sub #25
# kills kvstudy/cacheopt/policy.py:407:66 core/ReplaceBinaryOperator_Add_RShift #26
def test_a_guest_needs_s_p_plus_twice_s_o_plus_the_buffer():
    """Feasibility a - u >= s_p + 2 s_o + b. Host H (prompt 4, output 60) holds all 16 blocks (64 tokens); at t = 1
    its unused allocation is 64 - 5 = 59. Guest G (prompt 4, output 24) needs 4 + 48 + 8 = 60 > 59: it is not
    embedded (and, with no free block, waits)."""
    req = make_instance([4, 4], [60, 24], np.array([0.0, 0.5]))
    tape, res = run(embedder(), req, [10.0, 10.0], [5.0, 5.0], capacity=64)
    assert not any(e[3].lend for e in tape.log) and tape.inner.embedded == 0
    assert tape.at(1.0).prefill == []


# kills kvstudy/cacheopt/policy.py:415:45 core/ReplaceBinaryOperator_FloorDiv_RShift #3
def test_a_host_keeps_the_blocks_of_its_context_and_next_token():
    """buffer 0, 8 blocks of 4. Host H (prompt 4, output 8: M = 12) holds 3 blocks; at t = 1 its context is u = 5,
    a - u = 7 >= s_p + 2 s_o + b = 4 + 2 + 0 = 6 for guest G (prompt 4, output 1). But G needs ceil(5 / 4) = 2
    blocks and H must keep ceil((u + 1) / 4) = 2 of its 3: 3 - 2 = 1 < 2, no loan; G starts from free KV instead
    (s_p + B = 8 tokens)."""
    req = make_instance([4, 4], [8, 1], np.array([0.0, 0.5]))
    tape, res = run(embedder(buffer=0), req, [10.0, 10.0], [5.0, 5.0], capacity=32)
    d1 = tape.at(1.0)
    assert d1.lend == [] and d1.prefill == [(1, 4)] and d1.reserve == {1: 8}
    assert res.requests.completion_time.tolist() == [8.0, 2.0]


# kills kvstudy/cacheopt/policy.py:422:43 core/ReplaceBinaryOperator_Mul_Pow #8
def test_a_host_lends_to_two_guests_in_one_step():
    """Host H (prompt 4, output 60) holds all 16 blocks; G1 (prompt 4, output 4) and G2 (prompt 4, output 16)
    arrive at 0.5. At t = 1: H's unused allocation is 59 >= 4 + 8 + 8 for G1, which borrows 2 blocks (8 tokens):
    59 - 8 = 51 left, >= 4 + 32 + 8 = 44 for G2, which borrows ceil(20 / 4) = 5 in the same step."""
    req = make_instance([4, 4, 4], [60, 4, 16], np.array([0.0, 0.5, 0.5]))
    tape, res = run(embedder(), req, [10.0] * 3, [5.0] * 3, capacity=64)
    d1 = tape.at(1.0)
    assert d1.lend == [(1, 0, 2), (2, 0, 5)] and d1.prefill == [(1, 4), (2, 4)]
    assert res.status == "completed"


# kills kvstudy/cacheopt/policy.py:408:36 core/NumberReplacer #122
def test_a_host_preempted_in_this_step_lends_nothing():
    """Host H (prompt 4, output 60) holds all 16 blocks. At 1.5 arrive C (prompt 48, output 4, TTFT SLO 0.5 s) and
    G (prompt 4, output 4, TTFT SLO 10 s). At t = 2 C is critical and does not fit into H (48 + 8 + 8 = 64 > 64 -
    6): it needs 13 blocks and preempts H. G would fit into H's allocation, but H is gone: G takes 2 of the 3 blocks
    left from the pool instead."""
    req = make_instance([4, 48, 4], [60, 4, 4], np.array([0.0, 1.5, 1.5]))
    tape, res = run(embedder(), req, [10.0, 0.5, 10.0], [5.0] * 3, capacity=64)
    d2 = tape.at(2.0)
    assert d2.preempt == [(0, "recompute")] and d2.lend == []
    assert d2.prefill == [(1, 48), (2, 4)] and d2.reserve == {1: 52, 2: 8}


# kills kvstudy/cacheopt/policy.py:600:31 core/ReplaceBinaryOperator_Sub_LShift #42
def test_a_preempted_guest_frees_only_its_own_blocks():
    """12 blocks. Host H (prompt 4, output 40, estimated 30: M = 34, 9 blocks) starts at 0; guest G (prompt 4,
    output 30, estimated 4) borrows 2 of them at 1, outgrows them into the 3 free blocks (5 held) and stalls. At
    t = 25 H needs a block: none free, so its guest is preempted (the conflict rule). G's 5 blocks: the 2 loaned go
    back to H, 3 are freed; H takes 1: 2 free. D (prompt 8, arrived at 20) needs s_p + B = 12 tokens = 3 blocks:
    it does not start."""
    class Est(CacheOPT):
        def _estimate(self, view, i):
            return 30 if i == 0 else (4 if i == 1 else view.predicted[i])

    req = make_instance([4, 4, 8], [40, 30, 4], np.array([0.0, 1.0, 20.0]))
    policy = Est(token_budget=64, embedding=True, buffer=0, proactive=False, reserve_blocks=0, strategy="recompute")
    tape, res = run(policy, req, [10.0, 10.0, 100.0], [0.01, 100.0, 100.0], capacity=48)
    assert tape.at(1.0).lend == [(1, 0, 2)]
    d25 = tape.at(25.0)
    assert d25.preempt == [(1, "recompute")] and d25.prefill == [] and d25.reserve == {}


# --- step 10: allocation among the non-critical requests and links ------------------------------------------------
# kills kvstudy/cacheopt/policy.py:309:57 core/ReplaceBinaryOperator_Sub_Mod #15
def test_a_late_request_wants_the_rest_of_its_m():
    """8 blocks. V and A (prompt 12, output 16: M = 28) start at 0; their floors s_p + B = 16 fill the pool, so each
    gets 16 tokens (4 blocks). At t = 5 both need a block (context 17), none is free, TBT SLO 100 s: both late. C
    (prompt 4, TTFT SLO 0.5 s) arrived at 4.5 and is critical: it preempts V (first among equals) and takes 2 of
    V's 4 blocks: 2 free. A, late, wants the rest of its M: 28 - 16 = 12 tokens, cut to the 8 of the pool = 2
    blocks; with the block it needs now that is 3 > 2: the cut allocation is not taken, A gets its one block only
    (no new reservation this step). C finishes at 9, A at 16; V restarts at 16 and finishes at 27."""
    req = make_instance([12, 12, 4], [16, 16, 4], np.array([0.0, 0.0, 4.5]))
    tape, res = run(quiet(), req, [10.0, 10.0, 0.5], [100.0] * 3, capacity=32)
    d5 = tape.at(5.0)
    assert d5.preempt == [(0, "recompute")] and d5.prefill == [(2, 4)] and d5.reserve == {2: 8}
    assert res.requests.completion_time.tolist() == [27.0, 16.0, 9.0]


# kills kvstudy/cacheopt/policy.py:490:16 core/ReplaceContinueWithBreak #9
def test_a_top_up_and_a_new_request_share_the_pool_in_one_step():
    """10 blocks. A (prompt 8, output 20) and B (prompt 8, output 2, both estimated 20: M = 28) start cut to 20
    tokens (5 blocks) each; B finishes at 2. At t = 10 A's context is 18, within m = 2 of its 20: it is topped up
    to M = 28. C (prompt 4, output 2), arrived at 9.5, is a candidate in the same step: both fit in the 5 free
    blocks (2 + 2), A's reservation becomes 28 and C starts with 8."""
    class Wrong(CacheOPT):
        def _estimate(self, view, i):
            return 20 if i < 2 else view.predicted[i]

    req = make_instance([8, 8, 4], [20, 2, 2], np.array([0.0, 0.0, 9.5]))
    policy = Wrong(token_budget=64, embedding=False, proactive=True, m=2, reserve_blocks=0, strategy="recompute")
    tape, res = run(policy, req, [10.0] * 3, [5.0] * 3, capacity=40)
    assert tape.at(0.0).reserve == {0: 20, 1: 20}
    d10 = tape.at(10.0)
    assert d10.reserve == {0: 28, 2: 8} and d10.prefill == [(2, 4)]


# kills kvstudy/cacheopt/policy.py:521:20 core/ReplaceComparisonOperator_Gt_Is #3
def test_no_link_to_a_request_that_releases_after_the_cut_one_runs_out():
    """8 blocks. A (prompt 4, output 12: M = 16, 4 blocks) starts at 0. B (prompt 8, output 20: M = 28) arrives at 1:
    the pool is 4 blocks, B is cut to 16 tokens, 12 short. B exhausts its allocation in 16 - 8 = 8 tokens; A
    releases after 12 - 1 = 11 more: too late, so B is not linked to A (step 10 links only to a request releasing
    before). B stalls from 10; when A finishes at 12 no linked request takes A's blocks first (no reservation at
    12), B takes a block at a time as it returns."""
    req = make_instance([4, 8], [12, 20], np.array([0.0, 1.0]))
    tape, res = run(quiet(), req, [10.0, 10.0], [100.0, 100.0])
    assert [(e[0], e[3].reserve) for e in tape.log if e[3].reserve] == [(0.0, {0: 16}), (1.0, {1: 16})]
    assert not tape.inner._links and res.requests.completion_time.tolist() == [12.0, 23.0]


# --- swapped requests ---------------------------------------------------------------------------------------------
# kills kvstudy/cacheopt/policy.py:369:39 core/ReplaceBinaryOperator_Mul_BitAnd #5
def test_a_swapped_request_comes_back_only_with_room_for_its_kv_and_a_block():
    """strategy=swap, 8 blocks. A and B (prompt 8, output 20) start at 0 with 16 tokens (4 blocks) each. C (prompt
    8, output 4, TTFT SLO 0.5 s) arrives at 2, is critical and preempts A (loosest TBT SLO), swapped out with its 4
    blocks. When C finishes (t ~ 6) 4 blocks are free, but A's floor is its 4 blocks on the host plus one block
    (16 + 4 = 20 tokens > 16): A waits, and is swapped in only when B has finished (t ~ 20)."""
    req = make_instance([8, 8, 8], [20, 20, 4], np.array([0.0, 0.0, 2.0]))
    tape, res = run(quiet(strategy="swap"), req, [10.0, 10.0, 0.5], [1.0, 0.1, 1.0])
    assert tape.at(2.0).preempt == [(0, "swap")]
    swap_ins = [e[0] for e in tape.log if e[3].swap_in]
    assert len(swap_ins) == 1 and swap_ins[0] == pytest.approx(20.0, abs=0.01)
    assert res.status == "completed"


# --- SLOs, the study's tables, the traces -------------------------------------------------------------------------
# kills kvstudy/cacheopt/slo.py:56:19 core/ReplaceBinaryOperator_BitAnd_FloorDiv #0
def test_attainment_by_hand_without_warnings():
    """Attainment: a request attains its TTFT (TBT) SLO if it finished and its TTFT (worst gap) is within it. Four
    requests: done and on time; done, TTFT late, gaps fine; done, both late; not done. TTFT 1/4, TBT 2/4. A
    missed SLO is a plain False, no division (no RuntimeWarning)."""
    req = pd.DataFrame({"request_id": [0, 1, 2, 3], "state": ["done", "done", "done", "waiting"],
                        "ttft": [1.0, 3.0, 3.0, np.nan], "max_tbt": [0.1, 0.1, 0.5, np.nan]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ttft, tbt = slo.attainment(req, np.array([2.0] * 4), np.array([0.2] * 4))
    assert (ttft, tbt) == (0.25, 0.5)


# kills kvstudy/cacheopt/study.py:194:62 core/ReplaceBinaryOperator_Sub_Mul #10
def test_ablation_tbt_attainment_drop_by_hand():
    """The variant's TBT attainment drop is 100 (1 - variant / full): 0.6 against 0.8 is a drop of 25 %; its TTFT
    attainment 0.45 against 0.9 is 50 %."""
    cols = ["model", "hardware", "workload", "scale", "rate", "system", "seed", "ttft_p99", "ttft_p95",
            "worst_gap_p99", "worst_gap_p95", "ttft_attainment", "tbt_attainment", "normalized_latency",
            "policy_us_per_iteration", "tbt_p99", "tbt_p95"]
    full = ["m", "h", "t", 1.0, 1.0, "cacheopt", 0, 1.0, 1.0, 0.5, 0.5, 0.9, 0.8, 0.1, 10.0, 0.2, 0.2]
    variant = ["m", "h", "t", 1.0, 1.0, "cacheopt_wo_pa", 0, 2.0, 2.0, 1.0, 1.0, 0.45, 0.6, 0.2, 8.0, 0.4, 0.4]
    m = pd.DataFrame([full, variant], columns=cols)
    row = study.ablation_table(m).iloc[0]
    assert row["variant"] == "/PA"
    assert row["tbt_attainment_drop_pct"] == pytest.approx(25) and row["ttft_attainment_drop_pct"] == pytest.approx(50)


# kills kvstudy/cacheopt/study.py:50:36 core/ReplaceComparisonOperator_NotEq_Is #0
def test_metrics_name_each_setting_by_its_short_key(monkeypatch):
    """One finished run of a sweep (model opt_13b, hardware a100_tp1, trace sharegpt, demand scale 0.3 at 28 req/s,
    seed 7): its metrics row names the setting model / hardware / workload / scale / seed, and the rate is
    28 x 0.3 = 8.4 req/s. Two requests: done with TTFT 1 and 3 s -> ttft_p99 = 1 + 0.99 (3 - 1) = 2.98."""
    runs = pd.DataFrame([{"model.name": "opt_13b", "hardware.name": "a100_tp1", "workload.name": "sharegpt",
                          "demand.scale": 0.3, "seed": 7, "policy.name": "vllm", "demand.rate": 28.0,
                          "status": "completed", "folder": "f"}])
    req = pd.DataFrame({"request_id": [0, 1], "state": ["done", "done"], "ttft": [1.0, 3.0], "max_tbt": [0.1, 0.2],
                        "e2e_latency": [2.0, 4.0], "output_tokens": [2, 4], "arrival_time": [0.0, 0.0],
                        "first_scheduled_time": [0.0, 1.0], "completion_time": [2.0, 4.0], "preemptions": [0, 0]})
    monkeypatch.setattr(study.analysis, "load_sweep", lambda folder: runs)
    monkeypatch.setattr(study.analysis, "requests", lambda r: req)
    monkeypatch.setattr(study.analysis, "iterations", lambda r: pd.DataFrame())
    row = study.metrics("any").iloc[0]
    assert (row["model"], row["hardware"], row["workload"], row["scale"], row["seed"]) == \
        ("opt_13b", "a100_tp1", "sharegpt", 0.3, 7)
    assert row["system"] == "vllm" and row["rate"] == pytest.approx(8.4)
    assert row["ttft_p99"] == pytest.approx(2.98)


SETUP = ["model=opt_13b", "hardware=a100_tp1", "latency=linear", "predictor=lognormal_noise", "workload=sharegpt",
         "+demand=table1_rate", "demand.scale=0.3", "memory=paged", "memory.capacity_tokens=20000",
         "memory.block_size=8", "workload.num_requests=20", "engine.progress=false", "+policy=cacheopt",
         "policy.slo.calibration=sec34"]


# kills kvstudy/cacheopt/setup.py:88:19 core/ReplaceComparisonOperator_Eq_Is #0
def test_sec34_calibration_sets_the_tbt_reference(monkeypatch):
    """policy.slo.calibration=sec34 fixes the TBT reference at 0.2828 s (Sec. 3.4): with a TTFT reference given,
    the references are (2.0, 0.2828) without any baseline run; a tbt_ref set as well contradicts it (an error)."""
    monkeypatch.setattr(assemble, "simulate", None)  # no reference run may happen
    cfg = api.compose(SETUP + ["policy.slo.ttft_ref=2.0"])
    assert setup.slo_reference(api.run_context(cfg, latency=False), api.build_policy(cfg)) == (2.0, 0.2828)
    cfg = api.compose(SETUP + ["policy.slo.tbt_ref=0.1"])
    with pytest.raises(ConfigError, match="contradicts"):
        setup.slo_reference(api.run_context(cfg, latency=False), api.build_policy(cfg))


# kills kvstudy/cacheopt/workloads.py:42:36 core/NumberReplacer #19
def test_sharegpt_prompts_start_at_table_1s_minimum():
    """Table 1: ShareGPT's prompts are 16 to 3,200 tokens. The synthetic trace draws outside the range again, and
    reads the minimum as the 1/N quantile (N = 90,000): 20,000 draws never go below 16 and reach it."""
    df = workloads.synthetic("sharegpt", 20_000, np.random.default_rng(0), 2048)
    assert df["prompt_tokens"].min() == 16 and df["prompt_tokens"].max() <= 3200


# kills kvstudy/cacheopt/workloads.py:96:95 core/ReplaceBinaryOperator_Sub_BitXor #10
def test_a_pair_that_does_not_fit_is_redrawn_like_the_first_draw():
    """The module docstring's procedure, for Alpaca and a context (80 tokens) below Table 1's output maximum (292):
    outputs drawn in [min, min(max, context - 1)], prompts in [min, max], then every pair with prompt + output >
    context redrawn, prompt then output, from the same two truncated log-normals, until all fit. The trace is that
    draw, number for number, and every pair fits."""
    trace, mml = "alpaca", 80
    spec = workloads.TABLE1[trace]
    (om, olo, ohi), (pm, plo, phi), n = spec["output"], spec["prompt"], spec["requests"]
    rng = np.random.default_rng(0)
    output = workloads._draw(rng, 500, om, olo, min(ohi, mml - 1), n)
    prompt = workloads._draw(rng, 500, pm, plo, phi, n)
    while True:
        over = np.flatnonzero(prompt + output > mml)
        if not len(over):
            break
        prompt[over] = workloads._draw(rng, len(over), pm, plo, phi, n)
        output[over] = workloads._draw(rng, len(over), om, olo, min(ohi, mml - 1), n)
    df = workloads.synthetic(trace, 500, np.random.default_rng(0), mml)
    assert (df["prompt_tokens"] + df["output_tokens"]).max() <= mml
    assert df["prompt_tokens"].tolist() == prompt.tolist() and df["output_tokens"].tolist() == output.tolist()
