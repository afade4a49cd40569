"""Behaviour tests for the survivors of issue 55's seeded sample of 300 mutants (``python bench/mutation.py --sample
300 --seed 55``; docs/mutation.md lists each survivor and what became of it). Each is a hand-worked instance or a
property of a rule the suite had not pinned: the decision check's refusals, an overflow's cost under a latency model
that reads produced tokens, the host swap space's size, a network transfer beyond its profile, a rejection's words."""
import numpy as np
import pandas as pd
import pytest

from kvstudy.costs.transfer import network_reader
from kvstudy.engine import PolicyError
from kvstudy.latency.models import McsfAuthorsLatency
from kvstudy.memory import PagedMemory
from kvstudy.policies.protection import AlphaProtection
from kvstudy.policies.step import Decision, StepPolicy
from kvstudy.running.paths import PROFILES_DIR
from tests.conftest import make_instance
from tests.step_helpers import step_engine

NETWORK = PROFILES_DIR / "network" / "a100_pairwise_nvlink" / "send_recv.csv"


class Scripted(StepPolicy):
    """Returns ``decisions[k]`` at step k (then every running request decodes)."""

    name = "scripted"

    def __init__(self, *decisions):
        self.decisions = list(decisions)

    def step(self, view):
        return self.decisions[view.step] if view.step < len(self.decisions) else Decision(decode_all=True)


# --- the decision check refuses what it must, at once ---------------------------------------------------------------
@pytest.mark.parametrize("entry", [(1, 0), [1, 0, 1], (1, 0, 1, 0)])
def test_a_lend_entry_that_is_not_a_triple_is_refused(entry):
    """A runs (prompt 4: 1 block of 4 after step 0), B starts at step 1 with a loan from A written as a pair, a list
    or a 4-tuple: refused naming the entry's shape (a pair would otherwise fail to unpack, a list pass as one)."""
    policy = Scripted(Decision(prefill=[(0, 4)]), Decision(prefill=[(1, 4)], decode_all=True, lend=[entry]))
    with pytest.raises(PolicyError, match=r"lend entries are \(guest, host, blocks\), got "):
        step_engine(make_instance([4, 4], [4, 4]), policy, capacity=32).run()


@pytest.mark.parametrize("decode_all", [False, True])
def test_a_prefill_of_request_minus_one_is_refused_though_the_last_request_waits(decode_all):
    """Both requests wait at step 0 (both arrived at 0); a policy naming request -1 (Python's last) is refused: no
    request of this run has index -1, whatever the last one's state. With ``decode_all`` the decision is whole
    prefills plus everyone decoding, which the check takes the short way: refused there too."""
    with pytest.raises(PolicyError, match=r"names request -1 in prefill: not a request of this run"):
        step_engine(make_instance([4, 4], [4, 4]), Scripted(Decision(prefill=[(-1, 4)], decode_all=decode_all))).run()


def test_a_decode_only_decision_without_blocks_for_the_growth_is_refused_at_once():
    """3 blocks of 4 tokens. Step 0 prefills A and B (prompts 4: 1 block each, first tokens). Step 1: both contexts
    reach 5 tokens and each needs a 2nd block: 2 in use + 2 = 4 > 3. The policy decodes everyone anyway: refused in
    iteration 1 (the engine's short way for a decode-only decision counts the growing requests too)."""
    policy = Scripted(Decision(prefill=[(0, 4), (1, 4)]))
    with pytest.raises(PolicyError, match=r"^iteration 1 \(time 1\): policy 'scripted' decodes every running request, "
                                          r"which needs 4 KV blocks, more than the 3 the cache has"):
        step_engine(make_instance([4, 4], [4, 4]), policy, capacity=12).run()


def test_a_host_lending_to_two_guests_keeps_its_own_blocks_across_both_loans():
    """CacheOPT's embedding, two guests on one host. Step 0 prefills A (prompt 8) and reserves 40 tokens for it: 10
    blocks of 4. Step 1 starts B and C (prompts 4: 1 block each) on 4 of A's blocks each while A decodes: A keeps
    its next token's blocks, ceil((8 + 1 + 1) / 4) = 3, and 10 - 4 - 4 = 2 < 3: refused at the second loan (each
    alone would leave 6; the check adds the loans up)."""
    policy = Scripted(Decision(prefill=[(0, 8)], reserve={0: 40}),
                      Decision(prefill=[(1, 4), (2, 4)], decode_all=True, lend=[(1, 0, 4), (2, 0, 4)]))
    with pytest.raises(PolicyError, match=r"lends 4 blocks of request 0 to request 2: the guest needs at least its "
                                          r"context's blocks, the host keeps 3"):
        step_engine(make_instance([8, 4, 4], [4, 4, 4]), policy, capacity=64).run()


def test_one_loan_within_the_hosts_spare_blocks_is_carried_out():
    """The converse: B alone borrows 4 of A's 10 blocks, A keeps 6 >= 3; the run completes."""
    policy = Scripted(Decision(prefill=[(0, 8)], reserve={0: 40}),
                      Decision(prefill=[(1, 4)], decode_all=True, lend=[(1, 0, 4)]))
    res = step_engine(make_instance([8, 4], [4, 4]), policy, capacity=64).run()
    assert res.status == "completed"


def test_a_host_reserved_for_and_lending_to_two_guests_in_one_step_takes_its_reservation_once():
    """Issue 59's bug (CacheOPT at 10^6 requests): A holds 10 blocks; one step tops A up to 48 tokens (12 blocks) and
    lends 2 of them to B and 2 to C. Blocks in use after it: A 8, B 2, C 2 = 12, as the check counts. Holding A's
    reservation again before the second loan took back the first loan's 2 blocks: 14."""
    policy = Scripted(Decision(prefill=[(0, 8)], reserve={0: 40}),
                      Decision(prefill=[(1, 4), (2, 4)], decode_all=True, reserve={0: 48},
                               lend=[(1, 0, 2), (2, 0, 2)]))
    res = step_engine(make_instance([8, 4, 4], [4, 4, 4]), policy, capacity=64).run()
    assert res.status == "completed"
    assert res.iterations.blocks_used.tolist()[:2] == [10, 12]


# --- an overflow's cost when the latency model reads produced tokens ------------------------------------------------
def test_an_overflow_under_the_authors_formula_costs_the_overflowing_batch():
    """tests/policies/test_admission_paged.py's alpha-greedy overflow (prompts 3, outputs 7, 3 blocks of 4) timed by the MC-SF
    authors' formula: the clearing event costs the overflowing batch, 2 decodes whose produced tokens sum to 2 + 2
    = 4 (mean 2 per job): ((0.0027 x 2 + 0.52) x 2 + 44.6) / 1000 s."""
    req = make_instance(np.array([3, 3]), np.array([7, 7]))
    res = step_engine(req, AlphaProtection(alpha=0.0), capacity=12, block_size=4, latency=McsfAuthorsLatency()).run()
    event = res.iterations[res.iterations.overflow]
    assert res.clearing_events == 1 and event.cleared.item() == 2
    assert event.duration.item() == pytest.approx(((0.0027 * 2 + 0.52) * 2 + 44.6) / 1000, rel=1e-12)
    # the event's row: both victims recomputed, none swapped, nothing swapped in
    assert (event.preempted_recompute.item(), event.preempted_swap.item(), event.swapped_in.item()) == (2, 0, 0)


# --- sizes and transfers --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gib,per_token", [(1.0, 1000), (4.0, 327_680), (0.5, 12_345)])
def test_host_swap_space_is_the_gib_given_in_whole_blocks(gib, per_token):
    """swap_space_gb is GiB (vLLM's --swap-space): floor(gib x 2^30 / (block_size x bytes per token)) blocks."""
    mem = PagedMemory(1024, block_size=16, swap_space_gb=gib)
    mem.bind(per_token)
    assert mem.host_blocks_total == int(gib * 2**30) // (16 * per_token)


def test_a_transfer_beyond_the_profile_scales_at_the_largest_transfers_bandwidth():
    """Beyond the largest size profiled between nodes, seconds grow in proportion to bytes: 2x and 10x the largest
    size take 2x and 10x its median time (which the profile gives in ms)."""
    rows = pd.read_csv(NETWORK)
    rows = rows[rows["devices_per_node"] == 1].groupby("size")["time_stats.send_recv.median"].median()
    size, ms = float(rows.index.max()), float(rows[rows.index.max()])
    seconds = network_reader(NETWORK)
    assert seconds(size) == pytest.approx(ms / 1e3, rel=1e-12)
    assert seconds(2 * size) == pytest.approx(2 * ms / 1e3, rel=1e-12)
    assert seconds(10 * size) == pytest.approx(10 * ms / 1e3, rel=1e-12)


def test_a_rejection_says_the_requests_own_numbers():
    """64 tokens in blocks of 4 (16 blocks): a request of 40 + 30 tokens needs 18 blocks; the reason says so."""
    why = PagedMemory(64, block_size=4, watermark=0.0).rejection(40, 30)
    assert why.startswith("prompt + output = 70 tokens needs 18 blocks, more "), why


def test_a_clusters_policy_time_per_iteration_is_its_policy_time_over_its_iterations(tmp_path):
    """The cluster's summary reports the policies' wall time (``policy_seconds``, rounded to 0.1 ms) and that time per
    iteration in microseconds: the two agree over the merged iterations table (a wall-clock figure, so a relation,
    not a value)."""
    from kvstudy import api
    from tests.cluster.test_cluster import _trace

    rows = [{"arrival_time": 0.01 * k, "prompt_tokens": 8 + k % 50, "output_tokens": 60} for k in range(400)]
    # MC-SF through the adapter: asked at every iteration, so its time adds up past the 0.1 ms rounding
    result, summary = api.simulate(api.compose([
        "workload=trace", f"workload.path={_trace(tmp_path, rows)}", "model=llama32_1b", "hardware=a100_tp1",
        "memory=paged", "memory.capacity_tokens=2048", "+policy=mcsf", "latency=linear", "engine.progress=false",
        "cluster.replicas=2"]))
    its = len(result.iterations)
    us, seconds = summary["policy_us_per_iteration"], summary["policy_seconds"]
    assert its > 200 and seconds > 0.001, (its, seconds)
    assert abs(us - 1e6 * seconds / its) <= 1e6 * 5e-5 / its + 0.005, (us, seconds, its)


# --- the prefix cache through the memory's own methods ---------------------------------------------------------------
def _cache(segments):
    """Prefix caching on 16 blocks of 16 tokens, the requests' shared content ``segments`` ((key, tokens) pairs)."""
    mem = PagedMemory(256, block_size=16, watermark=0.0, prefix_caching=True)
    mem.bind(1)
    mem.set_segments(segments)
    return mem


def test_a_fully_cached_prompt_skips_all_but_its_last_block():
    """A's 32-token prompt (two full blocks of content "a") runs and leaves: both blocks stay cached. B has the same
    32 tokens: a prefill computes at least its last token, so it skips one block (16 tokens), not two, and says so
    before it starts (``cached_tokens``, what planning policies read) as when it starts."""
    mem = _cache([[("a", 32)], [("a", 32)]])
    assert mem.start(0, 32) == 0
    mem.advance(0, 32)
    mem.release(0, 32)
    assert mem.cached_tokens(1, 32) == 16 and mem.cached_tokens(1, 33) == 32
    assert mem.start(1, 32) == 16


def test_blocks_a_decode_filled_are_cached_when_their_request_leaves():
    """A's prompt is 16 tokens (content "a"); its output's first 20 tokens are content "b" (the workload names them:
    the next turn of a conversation). A starts with 1 block and leaves after 36 tokens of context: its 2nd block,
    filled by its decode, is cached too, so B (prompt "a" + "b", 36 tokens) finds 2 blocks, 32 tokens."""
    mem = _cache([[("a", 16), ("b", 20)], [("a", 16), ("b", 20)]])
    mem.start(0, 16)
    mem.advance(0, 16)
    mem.hold(0, 3)  # its decode grew to 36 tokens: 3 blocks
    mem.release(0, 36)
    assert mem.cached_tokens(1, 36) == 32


def test_a_chunk_scheduled_is_shared_at_once_and_a_preempted_prefill_caches_only_what_it_computed():
    """A's prompt is 64 tokens of content "a" (4 blocks). Its first chunk of 16 tokens is scheduled: that block is
    cached at once (vLLM v1 caches at scheduling), so B (a prompt of A's first 32 tokens) finds it while A runs. A is
    then preempted with those 16 tokens computed: only that block stays cached, not the three it never computed, so C
    (A's 64 tokens again) skips 16 tokens, not 48."""
    mem = _cache([[("a", 64)], [("a", 64)], [("a", 64)]])
    mem.start(0, 64)
    mem.advance(0, 16)
    assert mem.cached_tokens(1, 32) == 16
    mem.release(0, 16)
    assert mem.cached_tokens(2, 64) == 16


def test_auto_loads_when_the_transfer_beats_the_marginal_recompute_of_the_requests_own_prefill():
    """``memory.offload.choice=auto`` weighs a load against what those tokens add to the request's own prefill. A
    prompt of 100 tokens in blocks of 16: the GPU holds its first 2 blocks (32 tokens), the tier the next 2 (32). The
    prefill computes the rest anyway, 100 - 32 - 32 = 36 tokens. With a prefill costing 1e-6 x tokens^2 seconds,
    the tier's 32 tokens add (36 + 32)^2 - 36^2 = 3,328 us to it; reading 2 blocks of 1 MB at 1 GB/s takes 2,000 us:
    load. At 1.5 MB per block (3,000 us) still load; at 2 MB (4,000 us) recompute."""
    from kvstudy.memory.offload import OffloadConnector, OffloadTiers, Tier

    keys = [(1 << 32) + 16 * (j + 1) for j in range(6)]  # a prompt's six blocks (one chain, as the cache keys them)
    for block_bytes, loads in ((1_000_000, 2), (1_500_000, 2), (2_000_000, 0)):
        tiers = OffloadConnector(OffloadTiers([Tier("host", 1.0, 1.0, 1.0)], choice="auto"))
        tiers.bind(16, block_bytes)
        tiers.set_timing(1, lambda tokens, context: 1e-6 * tokens ** 2)
        tiers.save([keys[3], keys[2]])
        assert tiers.plan(keys, 2, (100 - 1) // 16, 100) == loads, block_bytes


def test_what_a_group_of_requests_frees_counts_a_shared_block_only_when_all_its_holders_leave():
    """A computes a 48-token prompt of content "a" (3 blocks, all cached); B and C start the same prompt while A runs:
    each shares A's first 2 blocks (a prefill computes at least its last token) and has 1 block of its own. If A and
    B leave, C still holds the 2 shared blocks: freed are A's 3rd block and B's own, 2 blocks. If all three leave, all
    5 distinct blocks (A's 3, B's and C's own) are freed."""
    mem = _cache([[("a", 48)]] * 3)
    mem.start(0, 48)
    mem.advance(0, 48)
    assert mem.start(1, 48) == 32 and mem.start(2, 48) == 32
    assert mem.used == 5
    assert mem.release_gain([0, 1])[0] == 2
    assert mem.release_gain([0, 1, 2])[0] == 5
    assert mem.freed_by(0) == 1 and mem.freed_by(1) == 1


def test_the_lru_hit_rate_of_two_identical_prompts():
    """``lru_hit_rate`` (notebook 05, bench/prefix_hits.py): two 1,024-token prompts with the same two trace blocks,
    one after the other, in a cache that holds both: the second skips (1,024 - 1) // 16 = 63 blocks, 1,008 tokens,
    of the 2,048 prompt tokens: 0.4921875."""
    from kvstudy.memory.prefix import lru_hit_rate

    assert lru_hit_rate([[1, 2], [1, 2]], [1024, 1024], [1, 1], num_blocks=1000) == 1008 / 2048


def test_a_decode_run_gives_the_authors_formula_the_tokens_each_request_produced():
    """vLLM's decode runs (issue 47) under the MC-SF authors' formula, which reads the decodes' produced tokens: two
    requests (prompts 4 and 6, outputs 5) prefill together, then decode 4 times with 1, 2, 3, 4 tokens produced each,
    so each decode-only iteration takes ((0.0027 x g + 0.52) x 2 + 44.6) / 1000 s for g = 1..4 (mean per job)."""
    from kvstudy.policies.vllm import VLLM

    res = step_engine(make_instance([4, 6], [5, 5]), VLLM(), capacity=64, latency=McsfAuthorsLatency()).run()
    want = [((0.0027 * 0 + 0.52) * 2 + 44.6 + 0.378 * 10) / 1000] + [((0.0027 * g + 0.52) * 2 + 44.6) / 1000
                                                                      for g in (1, 2, 3, 4)]
    assert res.iterations.duration.tolist() == pytest.approx(want, rel=1e-12)


# --- cost models ---------------------------------------------------------------------------------------------------
def test_a_deployment_that_does_not_fit_is_said_in_its_own_numbers_and_one_that_fits_is_not():
    """Llama2-70B on one A100 with 18,350 KV tokens: 2 x 80 layers x 8 KV heads x 128 x 2 bytes = 327,680 bytes a
    token, 6,012,928,000 bytes = 5.6 GiB, said as 6; with 128 GiB of weights it cannot fit in 79 GiB. Llama-3.2-1B
    with 1,000 tokens fits: no note."""
    from kvstudy.costs.capacity import fit_note
    from kvstudy.latency.tables import HardwareSpec
    from kvstudy.running.paths import load_model_arch

    hw = HardwareSpec("a100_tp1", "a100", "a100_pairwise_nvlink", 1)
    note = fit_note(load_model_arch("llama2_70b"), hw, 18_350)
    assert "(weights 128 GiB + 18,350 KV tokens 6 GiB) of 79 GiB" in note
    assert fit_note(load_model_arch("llama32_1b"), hw, 1_000) is None


def test_the_swap_and_recompute_fit_recovers_the_curves_it_was_given():
    """CacheOPT's O4 cost models (kvstudy/costs/preemption_cost.py ``fit``): given recompute seconds that are exactly
    2e-9 s^1.5 + 3e-6 s + 1e-3 and swap seconds exactly 5e-7 s + 2e-4 over 40 sizes, the fit picks beta = 1.5 (its grid
    holds it) and both models reproduce the points (mean absolute percentage error below 0.1%)."""
    from kvstudy.costs.preemption_cost import fit

    s = np.linspace(64, 4096, 40)
    cost = fit(s, 2e-9 * s ** 1.5 + 3e-6 * s + 1e-3, 5e-7 * s + 2e-4)
    assert cost.beta_r == pytest.approx(1.5, abs=1e-9)
    assert cost.fit_mape_pct["recompute"] < 0.1 and cost.fit_mape_pct["swap"] < 0.1


def test_the_synthetic_workloads_spread_is_table_1s_min_and_max():
    """CacheOPT's synthetic lengths (kvstudy/cacheopt/workloads.py): a lognormal whose 1/n and 1 - 1/n quantiles are
    Table 1's min and max (n its trace's requests), so sigma = ln(max / min) / (2 z) with z the standard normal's
    1 - 1/n quantile; BookCorpus's prompts: min 18, max 461,000, n = 11,000."""
    from scipy.stats import norm

    from kvstudy.cacheopt.workloads import TABLE1, lognormal_fit

    p_mean, p_min, p_max = TABLE1["bookcorpus"]["prompt"]
    assert (p_min, p_max) == (18, 461_000)
    _, sigma = lognormal_fit(p_mean, p_min, p_max, TABLE1["bookcorpus"]["requests"])
    assert sigma == pytest.approx(np.log(461_000 / 18) / (2 * norm.ppf(1 - 1 / 11_000)), rel=1e-9)


def test_least_kv_on_the_papers_memory_sees_a_finishing_iteration_with_the_kv_it_held(tmp_path):
    """Two replicas on the MC-SF paper's memory (KV in tokens, capacity 1,000), one-second rounds, MC-SF, least_kv.
    At 0: A (prompt 10, output 1) goes to replica 0, B (prompt 8, output 20) to replica 1. Replica 0's round [1, 2)
    decodes A's last token: until 2 the router sees the KV that round held, A's context 10 + its 1 new token = 11
    tokens. Replica 1 after its round [1, 2): B's context 8 + 2 - 1 = 9 and its next token, 10. C arrives at 1.5:
    10 < 11, so C goes to replica 1 (had the finishing round been counted at 10 - 1 = 9, to replica 0). A decode-only
    round (the next test: one with a prefill)."""
    import json

    from kvstudy import api

    rows = [{"arrival_time": 0.0, "prompt_tokens": 10, "output_tokens": 1},
            {"arrival_time": 0.0, "prompt_tokens": 8, "output_tokens": 20},
            {"arrival_time": 1.5, "prompt_tokens": 4, "output_tokens": 2}]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    res, _ = api.simulate(api.compose([
        "workload=trace", f"workload.path={tmp_path / 't.jsonl'}", "model=llama32_1b", "hardware=a100_tp1",
        "memory=paper", "memory.capacity_tokens=1000", "+policy=mcsf", "latency=linear", "latency.d0=1.0",
        "latency.d1=0", "engine.progress=false", "cluster.replicas=2", "router=least_kv"]))
    assert list(res.requests.replica) == [0, 1, 1]


def test_least_kv_on_the_papers_memory_sees_a_finishing_round_with_a_prefill_with_the_kv_it_held(tmp_path):
    """As above, the finishing round now also prefills (kvstudy/engine/loop.py's general path). One-second rounds.
    A (0.6, prompt 12, output 1) -> replica 0: prompt round [0.6, 1.6). B (0.9, 12, 2) -> replica 1 (empty): [0.9,
    1.9). C (1.4, 10, 4) -> replica 0. Replica 0's round [1.6, 2.6) prefills C and decodes A's last token: until 2.6
    the router sees the KV of its decodes, A's context 12 + 1 - 1 = 12 plus its new token, 13 (C's prefill is not a
    decode). D (1.9, 2, 2): replica 1 after B's prompt round holds 12 + 1 - 1 = 12 and B's next token, 13. A tie at
    13: fewer outstanding requests wins, replica 1 (1 against A and C, 2). Counted 12 - 1 = 11, replica 0 would win."""
    import json

    from kvstudy import api

    rows = [(0.6, 12, 1), (0.9, 12, 2), (1.4, 10, 4), (1.9, 2, 2), (2.4, 5, 3), (3.6, 6, 3)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"arrival_time": t, "prompt_tokens": p, "output_tokens": o})
                                              + "\n" for t, p, o in rows))
    res, _ = api.simulate(api.compose([
        "workload=trace", f"workload.path={tmp_path / 't.jsonl'}", "model=llama32_1b", "hardware=a100_tp1",
        "memory=paper", "memory.capacity_tokens=1000", "+policy=mcsf", "latency=linear", "latency.d0=1.0",
        "latency.d1=0", "engine.progress=false", "cluster.replicas=2", "router=least_kv"]))
    assert list(res.requests.replica)[:4] == [0, 1, 0, 1]
