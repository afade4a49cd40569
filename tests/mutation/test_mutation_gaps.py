"""Behaviour tests for the holes issue 55 found by applying small realistic bugs by hand (and a mutation tool,
bench/mutation.py): orders that only differ with three or more requests, ties, the decision check's fast path,
settings with two values tested unequal, second occurrences. Each test is a hand-worked instance (worked in its
docstring) or a property; none checks a line of code."""
import random

import numpy as np
import pytest

from kvstudy.cacheopt.preemption import tbt_bucket, victim_order
from kvstudy.costs.swap_models import PcieSwap
from kvstudy.cluster.routers import LeastKV, LeastOutstanding, PowerOfTwo, PrefixAffinity
from kvstudy.engine import PolicyError
from kvstudy.memory.offload import OffloadTiers, OffloadConnector, Tier
from kvstudy.policies.step import Decision, StepPolicy
from kvstudy.policies.rr_sjf import SJF, QueuedVLLM, RoundRobin, RRSJF
from kvstudy.policies.vllm import VLLM, Sarathi
from tests.conftest import make_instance
from tests.step_helpers import step_engine
from tests.cluster.test_routers import loads
from tests.memory.test_offload import ABC, A, B, C, BLOCK_BYTES, D0, D1, first_prefill, run


# --- 1. vLLM's preemption victim: the back of the running list (three requests) ----------------------------------
def test_vllm_preempts_the_latest_admitted_of_three():
    """Prompts [4, 4, 4], outputs [12, 12, 12], 6 blocks of 4 tokens (issue 55). Step 0 prefills A, B, C (3 blocks,
    first tokens). Step 1: every context reaches 5 tokens, each takes a 2nd block (6 used); steps 1-4 give tokens 2-5.
    Step 5: each needs a 3rd block and none is free: A's turn preempts the back of the list, C (2 blocks freed), A and
    B take one each; steps 5-8 give A and B tokens 6-9. Step 9: both need a 4th block: A's turn preempts B, the back
    of what is left (3 freed), A takes one; A's tokens 10-12 at steps 9-11: done at 12. Step 12: waiting [B, C] (a
    victim goes to the front); B re-prefills 4 + 9 = 13 tokens (4 blocks, token 10), C's 9 tokens (3 blocks) do not
    fit; B's tokens 11, 12 at steps 13, 14: done at 15. Step 15: C re-prefills 4 + 5 = 9 tokens (token 6); tokens
    7-12 at steps 16-21: done at 22. With the victim taken from the front (B at step 5) it would be [12, 22, 15]."""
    res = step_engine(make_instance([4, 4, 4], [12, 12, 12]), VLLM(), capacity=24).run()
    q = res.requests
    assert res.status == "completed"
    assert q.completion_time.tolist() == [12.0, 15.0, 22.0]
    assert q.preemptions_recompute.tolist() == [0, 1, 1]
    assert q.recomputed_tokens.tolist() == [0, 12, 8]  # B held 4 + 9 - 1 tokens' KV, C 4 + 5 - 1
    assert res.iterations.prefill_tokens.tolist() == [12] + [0] * 11 + [13, 0, 0, 9] + [0] * 6


# --- 2. the decision check's fast path counts the running requests' growth ----------------------------------------
class StartWhileGrowing(StepPolicy):
    """Starts A alone, then B's whole prefill with every running request decoding, whatever the memory."""

    name = "start_while_growing"

    def step(self, view):
        if 0 in view.waiting:
            return Decision(prefill=[(0, view.prompt[0])])
        if 1 in view.waiting:
            return Decision(prefill=[(1, view.prompt[1])], decode_all=True)
        return Decision(decode_all=True)


def test_a_start_that_leaves_no_block_for_a_growing_request_is_refused_at_once():
    """4 blocks of 4 tokens; A and B have prompts of 8 tokens. Step 0 prefills A (2 blocks, its first token). Step 1:
    A's context reaches 9 tokens and needs its 3rd block while the policy starts B (2 blocks) and decodes everyone:
    2 in use + 2 + 1 = 5 > 4, refused in iteration 1 (the decision of whole prefills plus ``decode_all`` is the check's
    short way; a short way that forgot A's growth would accept it and fail only at iteration 2, with 5/4 in use)."""
    with pytest.raises(PolicyError, match=r"^iteration 1 \(time 1\): policy 'start_while_growing' needs 5 KV blocks "
                                          r"after its decision, more than the 4"):
        step_engine(make_instance([8, 8], [4, 4]), StartWhileGrowing()).run()


def test_the_same_start_fits_when_its_blocks_and_the_growth_fit():
    """The converse, so the refusal above is about the count: B's prompt of 4 tokens takes 1 block, 2 + 1 + 1 = 4 fit.
    A has 2 output tokens, B 4. Step 0 prefills A (token 1); step 1 starts B (1 block, token 1) while A's token 2
    takes its 3rd block (4 in use): A is done at 2 and frees 3 blocks; B's tokens 2-4 at steps 2-4: done at 5."""
    res = step_engine(make_instance([8, 4], [2, 4]), StartWhileGrowing()).run()
    assert res.status == "completed"
    assert res.requests.completion_time.tolist() == [2.0, 5.0]
    assert res.iterations.blocks_used.tolist()[:2] == [2, 4]


# --- 3. a one-tier load reads at the tier's read bandwidth (read != write) --------------------------------------
@pytest.mark.parametrize("tier", ["host", "disk"])
def test_a_one_tier_load_takes_the_read_bandwidth(tier):
    """A tier alone with read 7 GB/s and write 5 GB/s (``paged_offload``'s disk): C loads A's three evicted blocks
    (choice=load; tests/memory/test_offload.py's instance), and its first prefill takes D0 + 16 D1 (the 16 tokens it
    computes) + 3 blocks / 7 GB/s, not / 5 GB/s (writes are asynchronous and cost no time)."""
    result, _ = run(ABC, [A, B, C], choice="load", **{f"{tier}_gb": 1.0, f"{tier}_read_gbps": 7.0,
                                                       f"{tier}_write_gbps": 5.0})
    assert result.requests.set_index("request_id").loc[2, "offload_loaded_tokens"] == 48
    assert first_prefill(result, 2) == pytest.approx(D0 + D1 * 16 + 3 * BLOCK_BYTES / 7e9, rel=1e-12)
    assert result.extra["offload"]["load_seconds"] == pytest.approx(3 * BLOCK_BYTES / 7e9, rel=1e-12)


def test_transfer_time_is_read_bandwidth_with_one_tier_or_two():
    """The same three blocks held in a tier of read 7 / write 5 GB/s take 3 x 1000 B / 7 GB/s whether the tier is
    alone or the first of two (the one-tier short way and the general count agree)."""
    keys = [(1 << 32) + 16 * j for j in (1, 2, 3)]  # a chain's first three blocks (BlockKeys' keys are ints)
    for tiers in ([Tier("disk", 1.0, 7.0, 5.0)], [Tier("host", 1.0, 7.0, 5.0), Tier("disk", 1.0, 2.0, 3.0)]):
        view = OffloadConnector(OffloadTiers(tiers))
        view.bind(16, 1000)
        view.save(keys)
        assert view.pool.transfer_seconds(keys, 0, 3) == pytest.approx(3 * 1000 / 7e9, rel=1e-12)


# --- 4. a block evicted a second time moves to the tier's most recently used end -------------------------------
#: four blocks of four unrelated chains, as BlockKeys/PathKeys name them (chain << 32 plus the block's end offset)
BLOCKS = tuple((n << 32) + 16 for n in range(1, 5))

def test_a_block_evicted_twice_is_touched_not_dropped_first():
    """A host tier of 3 one-byte blocks: the GPU evicts a, b, c (written, a least recent), then a again (the GPU had
    loaded and re-cached it: a block the tier holds already is touched, not written), then d: the least recently used
    is now b, which leaves; a stays. Written: 4 blocks (a once)."""
    a, b, c, d = BLOCKS
    view = OffloadConnector(OffloadTiers([Tier("host", 3e-9, 1.0, 1.0)]))
    view.bind(16, 1)
    view.save([a, b, c])
    view.save([a])
    view.save([d])
    assert list(view.pool.tiers[0].blocks) == [c, a, d]
    assert view.written == [4]
    assert view.pool.match([a], 0, 1) == [0] and view.pool.match([b], 0, 1) == []


def test_a_block_evicted_twice_moves_up_from_the_lower_tier():
    """Host of 2 blocks over a disk of 2: a, b, c evicted (a demoted to disk), then a again: written to the host
    (it leaves the disk: one tier at a time), which demotes b, the host's least recent; then d demotes c."""
    a, b, c, d = BLOCKS
    view = OffloadConnector(OffloadTiers([Tier("host", 2e-9, 1.0, 1.0), Tier("disk", 2e-9, 1.0, 1.0)]))
    view.bind(16, 1)
    view.save([a, b, c])
    assert [list(t.blocks) for t in view.pool.tiers] == [[b, c], [a]]
    view.save([a])
    assert [list(t.blocks) for t in view.pool.tiers] == [[c, a], [b]]
    view.save([d])
    assert [list(t.blocks) for t in view.pool.tiers] == [[a, d], [b, c]]
    assert view.written == [5, 3]


# --- 5. and every router's tie-break with a tie ------------------------------------------------------------------
def test_power_of_two_keeps_the_first_draw_on_a_tie():
    """Replicas 0 and 1 tie at 2 outstanding, 2 and 3 at 5: a draw of a tied pair keeps its first replica (and a
    draw of unequal ones the less loaded); the reference draws from the same seeded stream (``random.Random(seed)``,
    ``sample(range(4), 2)``) and applies the rule by hand."""
    r = PowerOfTwo()
    r.reset(11)
    state = loads(0, 0, 0, 0, outstanding=[2, 2, 5, 5])
    stream = random.Random(11)
    ties = 0
    for _ in range(40):
        a, b = stream.sample(range(4), 2)
        tie = state[a].outstanding == state[b].outstanding
        ties += tie
        assert r.route(0, state) == (a if tie else min((a, b), key=lambda k: state[k].outstanding))
    assert ties >= 5  # the draws do hit ties (both orders of a tied pair among them)


def test_power_of_two_on_equal_loads_is_the_first_draw():
    """Every replica equal: power_of_two routes exactly as the first of each seeded pair of draws."""
    r = PowerOfTwo()
    r.reset(2)
    stream = random.Random(2)
    assert [r.route(i, loads(0, 0, 0, outstanding=[1, 1, 1])) for i in range(25)] == \
        [stream.sample(range(3), 2)[0] for _ in range(25)]


def test_least_outstanding_tie_goes_to_the_lowest_index_among_three():
    """Waiting [4, 1, 1]: replicas 1 and 2 tie at the fewest, the lower index wins (Vidur's ``min`` in index
    order); [1, 1, 1]: replica 0."""
    r = LeastOutstanding()
    r.reset(0)
    assert r.route(0, loads(4, 1, 1)) == 1
    assert r.route(0, loads(1, 1, 1)) == 0


def test_least_kv_ties_on_share_then_outstanding_then_index():
    """Shares 10/100 tie on replicas 1 and 2 (replica 0 has 30/100): fewer outstanding wins (2 over 1 if 2 has
    fewer); equal outstanding: the lower index."""
    r = LeastKV()
    r.reset(0)
    assert r.route(0, loads(0, 0, 0, kv=[30, 10, 10], outstanding=[0, 3, 2])) == 2
    assert r.route(0, loads(0, 0, 0, kv=[30, 10, 10], outstanding=[0, 2, 2])) == 1
    assert r.route(0, loads(0, 0, 0, kv=[10, 10, 10], outstanding=[0, 0, 0])) == 0


def test_prefix_affinity_ties_on_cache_then_outstanding_then_index():
    """Replicas 1 and 2 hold the same 64 cached tokens of request 7 (replica 0 holds 16), all within the bound: the
    less loaded of the two wins; equal load too: the lower index."""
    router = PrefixAffinity(max_imbalance=10)
    cached = [{7: 16}, {7: 64}, {7: 64}]
    assert router.route(7, loads(0, 0, 0, outstanding=[0, 5, 3], cached=cached)) == 2
    assert router.route(7, loads(0, 0, 0, outstanding=[0, 3, 3], cached=cached)) == 1


# --- victim and admission orders with three or more requests, across the policy families ------------------------
THREE = ([4, 4, 4], [12, 12, 12])  # the instance of test_vllm_preempts_the_latest_admitted_of_three


@pytest.mark.parametrize("make", [lambda: Sarathi(chunk_size=64), QueuedVLLM, SJF],
                         ids=["sarathi", "fcfs", "sjf_equal_predictions"])
def test_the_decode_walk_preempts_the_back_in_every_vllm_family_policy(make):
    """The same three requests under Sarathi (a 64-token chunk takes each 4-token prompt whole, so its schedule is
    vLLM's), the fork's fcfs (vLLM with its own queues) and SJF with equal predictions (its running order, by
    (prediction, arrival), is then the admission order): the hand-worked schedule of the vLLM test, [12, 15, 22]."""
    res = step_engine(make_instance(*THREE), make(), capacity=24).run()
    assert res.status == "completed"
    assert res.requests.completion_time.tolist() == [12.0, 15.0, 22.0]
    assert res.requests.preemptions.tolist() == [0, 1, 1]


class Victims(StepPolicy):
    """Passes a policy's decisions through, noting each step's preempted requests."""

    def __init__(self, inner):
        self.inner, self.name, self.log = inner, inner.name, []

    def reset(self, seed):
        self.inner.reset(seed)
        self.log = []

    def step(self, view):
        d = self.inner.step(view)
        if d.preempt:
            self.log.append((view.step, [i for i, _ in d.preempt]))
        return d


def test_sjf_walk_preempts_the_longest_predicted_of_three():
    """The three requests with predictions [12, 20, 16]: SJF sorts its running list by (prediction, arrival), A, C,
    B, so at step 5 (each needs its 3rd block, none free) A's turn preempts B, the longest predicted, and C keeps
    going; at step 9 A preempts C. Waiting is sorted by prediction, C before B: A is done at 12, C re-prefills 13
    tokens at step 12 (done at 15), B 9 tokens at 15 (done at 22): [12, 22, 15], vLLM's order mirrored."""
    policy = Victims(SJF())
    res = step_engine(make_instance(*THREE), policy, capacity=24, predicted=np.array([12, 20, 16])).run()
    assert res.requests.completion_time.tolist() == [12.0, 22.0, 15.0]
    assert policy.log == [(5, [1]), (9, [2])]


# A, B, C (prompts 7: 2 blocks each) fill 6 blocks at step 0; D (prompt 4, 1 block) arrives at 0.5 and waits.
QUANTUM = (make_instance([7, 7, 7, 4], [12, 12, 12, 2], np.array([0, 0, 0, 0.5])), np.array([3, 20, 10, 2]))


@pytest.mark.parametrize("make, first", [(lambda: RoundRobin(steps_before_preemption=2), (2, [2])),
                                         (lambda: RRSJF(steps_before_preemption=2), (2, [1])),
                                         (SJF, (1, [1]))], ids=["rr", "rr_sjf", "sjf"])
def test_the_routine_victim_of_three_running(make, first):
    """Predictions [3, 20, 10, 2]; D does not fit while A, B, C run. Step 1 admits nothing: RR and RR-SJF find nobody
    eligible (each has run 1 step < the quantum of 2), SJF (no quantum) sees D's key 2 below the last of its running
    list sorted by prediction (B, 20) and preempts B at once. Step 2: all three are eligible: RR's victim is the
    latest admitted, C; RR-SJF's the longest predicted, B."""
    policy = Victims(make())
    req, predicted = QUANTUM
    res = step_engine(req, policy, capacity=24, predicted=predicted).run()
    assert res.status == "completed"
    assert policy.log[0] == first


def test_least_kv_compares_shares_not_free_blocks():
    """Replica 0 has 90 of 100 blocks in use (10 free, 90%), replica 1 has 1 of 2 (1 free, 50%): least_kv takes the
    smaller share, replica 1, though replica 0 has more blocks free."""
    state = loads(0, 0, kv=[90, 1])
    state[1].num_blocks = 2
    r = LeastKV()
    r.reset(0)
    assert r.route(0, state) == 1


def test_a_router_is_usable_before_a_run_resets_it():
    """A router made and used without ``reset`` draws as one reset with seed 0 (kvstudy/cluster/routers.py: "usable
    at once")."""
    fresh, reset = PowerOfTwo(), PowerOfTwo()
    reset.reset(0)
    state = loads(0, 0, 0, 0, outstanding=[1, 1, 1, 1])
    assert [fresh.route(i, state) for i in range(20)] == [reset.route(i, state) for i in range(20)]


def test_two_tiers_each_read_at_its_own_read_bandwidth():
    """tests/memory/test_offload.py's host-over-disk instance with every bandwidth different (host read 20, write 40; disk
    read 7, write 5 GB/s): C loads blocks 0 and 1 from the host and block 2 from the disk, so its first prefill takes
    D0 + 16 D1 + 2 blocks / 20 GB/s + 1 block / 7 GB/s (no write is timed)."""
    result, _ = run(ABC, [A, B, C], host_gb=2 * BLOCK_BYTES / 1e9, host_read_gbps=20.0, host_write_gbps=40.0,
                    disk_gb=1.0, disk_read_gbps=7.0, disk_write_gbps=5.0, choice="load")
    assert result.requests.set_index("request_id").loc[2, "offload_loaded_tokens"] == 48
    assert first_prefill(result, 2) == pytest.approx(D0 + D1 * 16 + 2 * BLOCK_BYTES / 20e9 + BLOCK_BYTES / 7e9,
                                                     rel=1e-12)
    tiers = result.extra["offload"]["tiers"]
    assert (tiers["host"]["read_blocks"], tiers["disk"]["read_blocks"]) == (2, 1)


def test_cacheopt_victim_ties_within_a_bucket_fall_to_the_next_key_then_the_given_order():
    """CacheOPT's victim keys are bucketed (B2.6): TBT SLOs at the edges 0.05, 0.2, 0.5 s (an edge opens its
    bucket), 128-token buckets of remaining work and KV held. Four requests with SLOs 0.2 and 0.45 (one bucket, [0.2,
    0.5)), remaining 200 and 250 (one bucket, 128-255): a tie, decided by the least KV held (129 and 255 share a
    bucket: a tie again, the given order) and 0 KV first: positions [3, 0, 1, 2]; three full ties keep their order."""
    assert [tbt_bucket(s) for s in (0.0499, 0.05, 0.2, 0.4999, 0.5)] == [0, 1, 2, 2, 3]
    assert victim_order([0.2, 0.45, 0.2, 0.45], [200, 250, 250, 200], [129, 255, 300, 0]) == [3, 0, 1, 2]
    assert victim_order([0.3, 0.3, 0.3], [10, 10, 10], [5, 5, 5]) == [0, 1, 2]
    assert victim_order([0.3, 0.3, 0.3], [10, 10, 130], [5, 5, 5]) == [2, 0, 1]


def test_prefix_affinity_default_bound_is_four_requests():
    """docs/cluster.md: ``max_imbalance`` is 4 unless set. Outstanding [0, 4, 5], request 7 cached longest on replica
    2, then 1: replica 2 is 5 above the least loaded (out of bound), replica 1 exactly 4 (in): replica 1."""
    state = loads(0, 0, 0, outstanding=[0, 4, 5], cached=[{7: 16}, {7: 32}, {7: 64}])
    assert PrefixAffinity().route(7, state) == 1


def test_least_kv_share_of_a_one_block_replica():
    """A replica of 1 block with it in use (100%) against one of 4 with 3 in use (75%): the second."""
    state = loads(0, 0, kv=[1, 3])
    state[0].num_blocks, state[1].num_blocks = 1, 4
    r = LeastKV()
    r.reset(0)
    assert r.route(0, state) == 1
    # a memory smaller than one block (capacity_tokens < block_size: 0 blocks, nothing in use) counts as 0% in use
    empty = loads(0, 0, kv=[0, 1])
    empty[0].num_blocks, empty[1].num_blocks = 0, 4
    assert r.route(0, empty) == 0


@pytest.mark.parametrize("make", [VLLM, lambda: Sarathi(chunk_size=64), QueuedVLLM, RoundRobin, RRSJF, SJF],
                         ids=["vllm", "sarathi", "fcfs", "rr", "rr_sjf", "sjf"])
def test_admission_stops_at_the_first_request_that_does_not_fit(make):
    """4 blocks of 4 tokens; prompts [8, 12, 4], one output token each (done in its prefill), all at 0. Step 0 starts
    A (2 blocks); B needs 3 more of the 2 free, and the walk stops there (vLLM's can_allocate LATER ends it), though C
    (1 block) would fit. Step 1 starts B and C (3 + 1 blocks): done at [1, 2, 2], prefills [8, 16]. (Equal predictions
    and waits give every policy the arrival order.)"""
    res = step_engine(make_instance([8, 12, 4], [1, 1, 1]), make()).run()
    assert res.requests.completion_time.tolist() == [1.0, 2.0, 2.0]
    assert res.iterations.prefill_tokens.tolist() == [8, 16]


def test_vllm_swapped_requests_come_back_first_out_first_in():
    """The three requests of the vLLM test under preemption_mode=swap. C is swapped out at step 5 (2 blocks), B at
    step 9 (3 blocks); A is done at step 12 and frees its 4 blocks (6 free). vLLM brings swapped requests back in
    the order they left: C first, taking its 2 blocks and the 3rd its next token needs; B, then first in line, needs
    its 3 blocks and a 4th (3 free): it waits. C's tokens 6-12 at steps 12-18 (done at 19), then B comes back (4
    blocks), tokens 10-12 at steps 19-21 (done at 22). Each iteration that copies adds its copy's seconds: 2 blocks
    out (step 5), 3 out (step 9), 2 in (step 12), 3 in (step 19)."""
    swap = PcieSwap()
    res = step_engine(make_instance(*THREE), VLLM(preemption_mode="swap"), capacity=24, swap=swap).run()
    two, three = swap.seconds(2), swap.seconds(3)
    assert res.requests.completion_time.tolist() == pytest.approx(
        [12 + two + three, 22 + 2 * two + 2 * three, 19 + 2 * two + three], rel=1e-12)
    assert res.requests.preemptions_swap.tolist() == [0, 1, 1]
    assert res.iterations.swapped_in.tolist() == [0] * 12 + [1] + [0] * 6 + [1, 0, 0]
