"""Behaviour tests for the survivors of issue 55's seeded mutation sample in the policies (kvstudy/policies/: vLLM and
Sarathi, the RR-SJF family, MC-SF and its admission adapter, the reserving policies RLP and S3, SGLang's cache-aware
orders) and the cost helpers (kvstudy/costs/arch.py). Each test is a hand-worked instance (the schedule worked in its
docstring, one-second iterations so times count iterations) of a rule the suite had not pinned; the mutant(s) each
one kills are named above it (the survivors judged equivalent have no test: they are listed with their reasons
beside the mutation report)."""
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

import kvstudy.engine  # noqa: F401  (first: at 08703e0 the engine and the admission adapter import each other)
from kvstudy.errors import ConfigError
from kvstudy.memory import PagedMemory
from kvstudy.policies.admission import Admission
from kvstudy.policies.base import SchedulerView
from kvstudy.policies.cache_orders import ordered
from kvstudy.policies.mcsf import MCSF
from kvstudy.policies.memory_check import BlockFutureMemory
from kvstudy.policies.reserving import RLP, S3
from kvstudy.policies.rr_sjf import QueuedVLLM, RoundRobin
from kvstudy.policies.step import Decision, StepPolicy
from kvstudy.policies.vllm import VLLM, Sarathi
from kvstudy.workloads.requests import make_requests
from tests.conftest import make_instance
from tests.step_helpers import ARCH, step_engine


def firsts(res):
    """Each request's first-token time (one-second iterations: the iteration count at its first token)."""
    return res.requests.first_token_time.tolist()


def seg(*keys):
    """Prefix-cache segments of one 4-token block per key."""
    return [(k, 4) for k in keys]


# --- model arithmetic (kvstudy/costs/arch.py) ------------------------------------------------------------------------
# kills kvstudy/costs/arch.py:42:85 core/ReplaceComparisonOperator_Lt_NotEq #0
@pytest.mark.parametrize("params", [-7.0e10, -1, float("nan"), float("inf"), 0])
def test_a_model_with_no_positive_finite_parameter_count_is_refused(params):
    """num_params must be a finite number > 0: a negative count (-7e10, -1) is refused like 0, nan and inf."""
    with pytest.raises(ConfigError, match=r"model.num_params=.*allowed a finite number > 0"):
        dataclasses.replace(ARCH, num_params=params)


# kills kvstudy/costs/arch.py:61:40 core/ReplaceBinaryOperator_FloorDiv_Mod #1
@pytest.mark.parametrize("tp,kv_heads", [(1, 8), (2, 4), (4, 2), (8, 1), (16, 1)])
def test_kv_bytes_per_token_splits_the_kv_heads_over_the_gpus(tp, kv_heads):
    """Llama-2-70B: 80 layers, 8 KV heads of 128 dims, 2 bytes. K and V per token per GPU = 2 x 80 x ceil(8 / tp)
    x 128 x 2 bytes: 327,680 on one GPU, 163,840 on two, ..., 20,480 when there are more GPUs than KV heads (a head
    is replicated, never split)."""
    assert ARCH.num_kv_heads == 8 and ARCH.num_layers == 80 and ARCH.head_dim == 128 and ARCH.dtype_bytes == 2
    assert ARCH.kv_bytes_per_token(tp) == 2 * 80 * kv_heads * 128 * 2


# --- the MC-SF view and eq. (5) ---------------------------------------------------------------------------------------
# kills kvstudy/policies/base.py:47:82 core/ReplaceBinaryOperator_Add_LShift #1
def test_a_view_given_arrays_counts_each_running_requests_kv_as_prompt_plus_rounds_plus_one():
    """Sec. 2: a running request that has completed j decode rounds holds s + j + 1 KV tokens this round. Running
    prompts 3 and 10 after 2 and 0 rounds: 6 + 11 = 17 tokens in use (not 2 x (s + j) = 10 + 20)."""
    view = SchedulerView(round=0, time=0.0, capacity=100, waiting_ids=np.empty(0, np.int64),
                         waiting_prompt=np.empty(0, np.int64), waiting_predicted=np.empty(0, np.int64),
                         waiting_arrival=np.empty(0), running_ids=np.array([0, 1]), running_prompt=np.array([3, 10]),
                         running_generated=np.array([2, 0]), running_predicted=np.array([9, 9]),
                         running_arrival=np.zeros(2))
    assert view.running_kv_tokens == 17


# kills kvstudy/policies/memory_check.py:226:91 core/ReplaceBinaryOperator_Sub_BitXor #10
def test_eq5_in_blocks_admits_a_request_that_fills_the_cache_exactly_at_its_predicted_end():
    """Paged eq. (5): a prompt of 4 predicted to decode d = 4 rounds holds 4 + 4 = 8 tokens at its end: exactly 2
    blocks of 4, the whole cache. It fits (2 <= 2): alone, it is admitted at once. Through MC-SF on the engine:
    prompt 4, predicted output 5 (the prefill's token, then 4 decodes; true output 4) in 8 tokens: first token at 1."""
    mem = BlockFutureMemory(8, np.empty(0, np.int64), np.empty(0, np.int64), 4, 0)
    assert mem.try_add(4, 4) is True
    mem = BlockFutureMemory(8, np.empty(0, np.int64), np.empty(0, np.int64), 4, 0)
    assert mem.try_add(4, 5) is False  # 9 tokens at its end: 3 blocks
    res = step_engine(make_instance(np.array([4]), np.array([4])), MCSF(), capacity=8, block_size=4,
                      predicted=np.array([5])).run()
    assert firsts(res) == [1.0]


# kills kvstudy/policies/mcsf.py:79:36 core/ReplaceBinaryOperator_Mul_BitOr #0
def test_prefix_aware_mcsf_charges_a_running_request_without_shared_blocks_in_full():
    """Prefix-aware MC-SF on a prefix cache of 3 blocks of 4, nothing shared. A (prompt 4, output 8) starts at 0.
    B (prompt 4, output 4: d = 3 decode rounds) arrives at 0.5. At step 1 A has decoded 0 rounds (w = 5, d = 6): at
    B's end point 3, A holds ceil(8 / 4) = 2 blocks and B ceil(7 / 4) = 2: 4 > 3, B waits (charging A a block less
    would let it in, and the cache would overflow at step 5, when A needs its 3rd block). B waits until A has left:
    A's last token is at 8, B starts at step 8, its first token at 9; no clearing."""
    req = make_requests([0.0, 0.5], [4, 4], [8, 4], source="test", segments=[seg(1), seg(2)])
    res = step_engine(req, MCSF(prefix_aware=True), capacity=12, block_size=4, prefix_caching=True).run()
    assert res.status == "completed" and res.clearing_events == 0
    assert firsts(res) == [1.0, 9.0]


# --- the admission adapter (kvstudy/policies/admission.py) ------------------------------------------------------------
# kills kvstudy/policies/admission.py:308:41 core/ReplaceBinaryOperator_Sub_LShift #16
# kills kvstudy/policies/admission.py:308:41 core/ReplaceBinaryOperator_Sub_Pow #16
def test_max_batch_caps_the_running_requests_decodes_first():
    """max_batch = 2 (the alpha scripts' B). A (prompt 4, output 10) starts at step 0; B, C, D (prompt 4, output 2)
    arrive at 0.5; the cache (100 blocks) holds them all. At step 1 one slot is left (2 - 1 running): MC-SF takes
    the shortest first, B only (first token at 2; its 2nd token in step 2). C takes the slot at step 3 (first token
    4), D at step 5 (first token 6). Never more than 2 in a batch."""
    req = make_instance(np.array([4, 4, 4, 4]), np.array([10, 2, 2, 2]), np.array([0.0, 0.5, 0.5, 0.5]))
    res = step_engine(req, Admission(MCSF(), max_batch=2), capacity=400, block_size=4).run()
    assert firsts(res) == [1.0, 2.0, 4.0, 6.0]
    assert res.iterations.batch_size.max() == 2


# kills kvstudy/policies/admission.py:259:64 core/ReplaceBinaryOperator_BitAnd_Pow #0
def test_mcsf_breaks_a_tie_of_prediction_and_arrival_by_request_id():
    """Eq. (6)'s order: shortest predicted output, ties by arrival, then id. Two requests arrive together with the
    same prompt (4) and output (4), listed with ids 5 then 3; the cache (8 tokens, blocks of 4) holds one at a time
    (4 + 4 - 1 = 7 tokens: 2 blocks each). Id 3 (the second row) starts first: first tokens 5 (id 5) and 1 (id 3)."""
    req = make_requests([0.0, 0.0], [4, 4], [4, 4], source="test", request_id=[5, 3])
    res = step_engine(req, MCSF(), capacity=8, block_size=4).run()
    q = res.requests.set_index("request_id")
    assert q.first_token_time.to_dict() == {5: 5.0, 3: 1.0}


# --- vLLM and Sarathi (kvstudy/policies/vllm.py) ---------------------------------------------------------------------
# kills kvstudy/policies/vllm.py:134:32 core/ReplaceComparisonOperator_Lt_Gt #1
def test_vllm_preempts_only_the_newest_when_two_growing_requests_share_the_last_free_block():
    """4 blocks of 4. A, B (prompt 4, output 3) and C (prompt 2, output 6) start at step 0 (1 block each, 1 free).
    At step 1 A and B each need a 2nd block (context 5), 1 is free: A takes it; B's turn finds none, so the back of
    the running list, C, is preempted (recompute) and B takes C's block. A and B end at step 2 (last tokens at 3);
    C restarts at step 3 with prompt + 1 token (first token 1 from its first run), done at 8."""
    res = step_engine(make_instance(np.array([4, 4, 2]), np.array([3, 3, 6])), VLLM(), capacity=16,
                      block_size=4).run()
    q = res.requests
    assert q.preemptions.tolist() == [0, 0, 1] and q.completion_time.tolist() == [3.0, 3.0, 8.0]


class ChunkedByHand(Sarathi):
    """Sarathi whose first step is given: request 0 and request 2 prefill whole, request 1 only 4 of its tokens (left
    in prefill), in the running order 0, 1, 2 (a state Sarathi's own admissions do not reach: a prefill in chunks
    takes the whole budget until its last chunk)."""

    def step(self, view):
        if view.step == 0:
            return Decision(prefill=[(0, 2), (1, 4), (2, 4)])
        return super().step(view)


# kills kvstudy/policies/vllm.py:143:15 core/AddNot #11
def test_sarathi_continues_a_chunked_prefill_through_a_step_that_preempts():
    """5 blocks of 4. Step 0: D (prompt 2, output 3: 1 block) and G (prompt 4, output 3: 1 block) prefill whole, P
    (prompt 12: 3 blocks) 4 of its tokens; no block is free. Step 1: G's context reaches 5 and needs a block. The
    decode walk decodes D (no block needed), passes over P (in its prefill, not a decode) and, no block being free
    and nobody behind G, preempts G itself. In the same iteration D decodes and P's prefill goes on (8 tokens within
    the budget of 16 - 1): P's first token at 2, done at 3. G restarts at step 3 (its first token was at 1)."""
    res = step_engine(make_instance(np.array([2, 12, 4]), np.array([3, 2, 3])), ChunkedByHand(chunk_size=16),
                      capacity=20, block_size=4).run()
    q = res.requests
    assert firsts(res) == [1.0, 2.0, 1.0] and q.preemptions.tolist() == [0, 0, 1]
    assert q.completion_time.tolist() == [3.0, 3.0, 5.0]


# kills kvstudy/policies/vllm.py:198:29 core/ReplaceBinaryOperator_Add_BitOr #6
def test_vllm_admits_no_more_than_max_num_seqs_in_one_step():
    """max_num_seqs = 1: A and B (prompt 4, output 2) arrive together. A starts at step 0; B cannot join it (1 + 1
    > 1), not even in the same admission walk: B starts at step 2, when A has ended (first tokens 1 and 3)."""
    res = step_engine(make_instance(np.array([4, 4]), np.array([2, 2])), VLLM(max_num_seqs=1), capacity=16,
                      block_size=4).run()
    assert firsts(res) == [1.0, 3.0] and res.iterations.batch_size.max() == 1


def lpm_instance():
    """4 blocks of 4 with prefix caching. Z (prompt 4, key 1, output 1) and R (prompt 6, keys 2 3, output 10) start at
    step 0; Z ends there, leaving its block cached. H (prompt 12: 3 blocks) arrives at 0.5, S (prompt 4, key 1: Z's
    block) at 0.6. At step 1 R holds 2 blocks, 2 are free: H cannot start before R ends (step 10), S can."""
    return make_requests([0.0, 0.0, 0.5, 0.6], [4, 6, 12, 4], [1, 10, 2, 2], source="test",
                         segments=[seg(1), seg(2, 3), seg(4, 5, 6), seg(1)])


# kills kvstudy/policies/vllm.py:185:30 core/ReplaceComparisonOperator_NotEq_Eq #0
@pytest.mark.parametrize("order,s_first", [("fcfs", 11.0), ("lpm", 2.0), ("dfs_weight", 2.0)])
def test_a_cache_aware_order_starts_the_cached_request_behind_a_blocked_head(order, s_first):
    """lpm_instance: FCFS walks H first, which does not fit, so S waits behind it until R has left (R's last token
    at 10): H and S start at step 10, S's first token at 11. LPM and DFS-weight walk S first (1 cached block, H
    none): S starts at step 1 (1 block of the 2 free), first token at 2."""
    res = step_engine(lpm_instance(), VLLM(waiting_order=order), capacity=16, block_size=4,
                      prefix_caching=True).run()
    assert firsts(res)[3] == s_first


# --- the RR-SJF family (kvstudy/policies/rr_sjf.py) -------------------------------------------------------------------
# kills kvstudy/policies/rr_sjf.py:136:27 core/ReplaceBinaryOperator_Add_FloorDiv #4
def test_fcfs_admission_stops_at_the_token_budget():
    """max_num_batched_tokens = 6: A and B (prompt 4) arrive together; 4 + 4 > 6, so step 0 prefills A only and B
    starts at step 1 (a prefill-only step: first tokens 1 and 2)."""
    res = step_engine(make_instance(np.array([4, 4]), np.array([2, 2])), QueuedVLLM(max_num_batched_tokens=6),
                      capacity=16, block_size=4).run()
    assert firsts(res) == [1.0, 2.0]


class LoggedRR(RoundRobin):
    """RR that keeps each step's preemptions."""

    def reset(self, seed):
        super().reset(seed)
        self.preempted = {}

    def step(self, view):
        d = super().step(view)
        self.preempted[view.step] = [i for i, _ in d.preempt]
        return d


# kills kvstudy/policies/rr_sjf.py:146:73 core/ReplaceComparisonOperator_Eq_Gt #12
def test_round_robin_preempts_only_until_the_head_fits():
    """4 blocks of 4, quantum 1 step. A and B (prompt 8: 2 blocks each) start at step 0 and fill the cache; C (prompt
    4: 1 block) waits. Step 1 admits nothing, so the RR routine runs: both A and B are eligible; preempting the
    latest admitted, B, frees 2 blocks and C fits: A is kept (it decodes)."""
    policy = LoggedRR(steps_before_preemption=1)
    step_engine(make_instance(np.array([8, 8, 4]), np.array([6, 6, 2])), policy, capacity=16, block_size=4).run()
    assert policy.preempted[1] == [1]


# --- RLP and S3 (kvstudy/policies/reserving.py) ---------------------------------------------------------------------
# kills kvstudy/policies/reserving.py:100:22 core/ReplaceComparisonOperator_Eq_Lt #2
def test_rlp_admission_stops_at_the_first_demand_that_does_not_fit_now():
    """RLP without padding, 4 blocks of 4. A (prompt 4, output 2) reserves 6 tokens: 2 blocks. B (prompt 8, output
    4) would reserve 12 tokens: 3 blocks, only 2 are free: B waits, and C (prompt 2, output 2: 1 block) behind it
    waits too (FCFS: the walk stops). A's last token is at 2; B and C start at step 2 (first tokens 1, 3, 3)."""
    res = step_engine(make_instance(np.array([4, 8, 2]), np.array([2, 4, 2])), RLP(padding=0), capacity=16,
                      block_size=4).run()
    assert firsts(res) == [1.0, 3.0, 3.0]


# kills kvstudy/policies/reserving.py:84:30 core/ReplaceBinaryOperator_Add_Div #6
# kills kvstudy/policies/reserving.py:84:30 core/ReplaceBinaryOperator_Add_Mod #6
def test_s3_swaps_back_an_outgrown_request_with_its_doubled_demand():
    """S3 with 4-token buckets, 4 blocks of 4. A: prompt 4, true output 8, predicted 1: its demand is the bucket's
    upper bound, 4 tokens, so it reserves 4 + 4 = 8 tokens (2 blocks). Its 5th token (context 9) needs a 3rd block:
    at step 5 it is swapped out and its demand doubles to 8; it comes back at once holding 4 + 8 = 12 tokens (3
    blocks, the 3 it needs now: nothing extra) and its last token is at 8 (plus the swap copies' time)."""
    res = step_engine(make_instance(np.array([4]), np.array([8])), S3(bucket=4), capacity=16, block_size=4,
                      predicted=np.array([1])).run()
    q = res.requests
    assert res.status == "completed" and q.preemptions_swap.tolist() == [1]
    assert q.completion_time.item() == pytest.approx(8.0, abs=0.01)
    assert res.iterations.blocks_used.max() == 3


# --- what the step view tells a policy (kvstudy/policies/step.py) -----------------------------------------------------
class WatchesLastToken(StepPolicy):
    """Starts request 0, then decodes every step, noting ``view.last_token_time(0)`` each time."""

    name = "watch"

    def reset(self, seed):
        self.seen = []

    def step(self, view):
        if view.step == 0:
            return Decision(prefill=[(0, 4)])
        self.seen.append((view.time, view.last_token_time(0)))
        return Decision(decode_all=True)


# kills kvstudy/policies/step.py:103:45 core/ReplaceComparisonOperator_Gt_Lt #0
def test_last_token_time_follows_every_decode():
    """Prompt 4, output 5, one-second iterations: the prefill's token at 1, then a decode token at 2, 3, 4. At the
    start of each step (times 1, 2, 3, 4) the latest token is the one just produced."""
    policy = WatchesLastToken()
    step_engine(make_instance(np.array([4]), np.array([5])), policy, capacity=16, block_size=4).run()
    assert policy.seen == [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0), (4.0, 4.0)]


# --- SGLang's cache-aware orders (kvstudy/policies/cache_orders.py) ---------------------------------------------------
def order_view(n, cached_last):
    """n waiting requests 1..n (prompt 4, one block each, keys 101..); request 0 (key 1) has been cached and
    released. With ``cached_last`` the last waiting request's block is key 1: a hit of 1 block, the others none."""
    segments = [seg(1)] + [seg(100 + k) for k in range(1, n + 1)]
    if cached_last:
        segments[n] = seg(1)
    mem = PagedMemory(4 * 1000, block_size=4, prefix_caching=True)
    mem.bind(1)
    mem.set_segments(segments)
    mem.start(0, 4)
    mem.advance(0, 4)
    mem.release(0, 4)
    return SimpleNamespace(memory=mem, prompt=[4] * (n + 1), waiting_generated=[0] * (n + 1),
                           waiting=list(range(1, n + 1)))


# kills kvstudy/policies/cache_orders.py:23:16 core/NumberReplacer #1
def test_lpm_still_sorts_a_queue_of_128():
    """SGLang falls back to FCFS above 128 waiting requests, not at 128: 128 waiting, the last one's block cached,
    LPM puts it first; with 129 the queue keeps its order."""
    assert ordered(order_view(128, True), "lpm") == [128] + list(range(1, 128))
    assert ordered(order_view(129, True), "lpm") == list(range(1, 130))


# kills kvstudy/policies/cache_orders.py:81:22 core/ReplaceComparisonOperator_Eq_NotEq #1
def test_dfs_weight_sorts_a_queue_of_any_length():
    """The 128 limit is LPM's only: DFS-weight over 129 waiting requests still puts the one with a cached prefix
    first (its subtree is the only weighted one), the unmatched after it in queue order."""
    assert ordered(order_view(129, True), "dfs_weight") == [129] + list(range(1, 129))
