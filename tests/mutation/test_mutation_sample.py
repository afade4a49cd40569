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


def test_a_prefill_of_request_minus_one_is_refused_though_the_last_request_waits():
    """Both requests wait at step 0 (both arrived at 0); a policy naming request -1 (Python's last) is refused: no
    request of this run has index -1, whatever the last one's state (the short way of the check included)."""
    with pytest.raises(PolicyError, match=r"names request -1 in prefill: not a request of this run"):
        step_engine(make_instance([4, 4], [4, 4]), Scripted(Decision(prefill=[(-1, 4)]))).run()


def test_a_decode_only_decision_without_blocks_for_the_growth_is_refused_at_once():
    """3 blocks of 4 tokens. Step 0 prefills A and B (prompts 4: 1 block each, first tokens). Step 1: both contexts
    reach 5 tokens and each needs a 2nd block: 2 in use + 2 = 4 > 3. The policy decodes everyone anyway: refused in
    iteration 1 (the engine's short way for a decode-only decision counts the growing requests too)."""
    policy = Scripted(Decision(prefill=[(0, 4), (1, 4)]))
    with pytest.raises(PolicyError, match=r"^iteration 1 \(time 1\): policy 'scripted' decodes every running request, "
                                          r"which needs 4 KV blocks, more than the 3 the cache has"):
        step_engine(make_instance([4, 4], [4, 4]), policy, capacity=12).run()


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
