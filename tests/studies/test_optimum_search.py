"""The exact window branch-and-bound and the large-neighbourhood search: exact where they say so, every
schedule feasible under the IP's own constraint rows, never worse than where they started, deterministic."""
import numpy as np
import pytest

from kvstudy.optimum import branch
from kvstudy.optimum.bounds import block_bound, latest_starts, srpt_sum_of_completions, volume_bound
from kvstudy.optimum.checker import check
from kvstudy.optimum.instance import Instance, synthetic
from kvstudy.optimum.ip import brute_force, build, indicator, solve
from kvstudy.optimum.lns import improve
from kvstudy.optimum.online import starts
from kvstudy.policies.mcsf import MCSF
from tests.instances import tiny


def exact_by_branch(inst: Instance, **kw) -> branch.BranchResult:
    budget = np.full(inst.horizon() + 1, inst.capacity)
    return branch.solve(inst.arrival, inst.prompt, inst.output, budget, **kw)


@pytest.mark.parametrize("seed", range(8))
def test_branch_matches_exhaustive_search(seed):
    inst = tiny(100 + seed)
    res = exact_by_branch(inst)
    assert res.proven
    assert check(inst, res.start) == brute_force(inst)


@pytest.mark.parametrize("seed", range(3))
def test_branch_matches_the_ip_on_small_instances(seed):
    inst = tiny(200 + seed, n=5, memory=(12, 18), prompt_max=3, arrival_max=4)
    warm = starts(inst, MCSF())
    res = exact_by_branch(inst, incumbent=warm)
    ip = solve(inst, warm_start=warm, time_limit=60)
    assert res.proven and ip.proven_optimal
    assert check(inst, res.start) == ip.objective


def test_branch_node_limit_is_never_called_proven():
    inst = synthetic(1, np.random.default_rng(0))
    res = exact_by_branch(inst, incumbent=starts(inst, MCSF()), node_limit=200)
    assert not res.proven
    assert check(inst, res.start) <= check(inst, starts(inst, MCSF()))


def test_srpt_on_a_hand_worked_example():
    # job A (release 0, 4) runs 0-1, B (release 1, 1) preempts: done at 2, A resumes, done at 5; C at 5 -> 7
    assert srpt_sum_of_completions([0, 1, 5], [4, 1, 2]) == 2 + 5 + 7


def test_block_bound_is_tight_on_two_heavy_requests():
    # M = 10, two requests peaking at 9: the second cannot be active when the first peaks (it would hold >= 2),
    # so it starts at 8 at the earliest: OPT = 8 + 16. Tails (> 5 tokens) are 4 rounds, gaps after them 4.
    inst = Instance(np.zeros(2, int), np.array([1, 1]), np.array([8, 8]), 10)
    assert block_bound(inst) == brute_force(inst) == 24
    assert volume_bound(inst) < 24


@pytest.mark.parametrize("seed", range(12))
def test_bounds_stay_below_the_proven_optimum(seed):
    # heavy requests, large prompts (the gap after a tail depends on them) and arrivals over time
    inst = tiny(300 + seed, n=5, memory=(10, 20), prompt_max=5, arrival_max=6)
    ip = solve(inst, warm_start=starts(inst, MCSF()), time_limit=60)
    assert ip.proven_optimal
    assert block_bound(inst) <= ip.objective and volume_bound(inst) <= ip.objective
    assert check(inst, exact_by_branch(inst).start) == ip.objective  # its pruning uses the block bound
    # the block rows are valid inequalities: the bare (1)-(4) has the same optimum
    assert solve(inst, time_limit=60, blocks=False).objective == ip.objective


@pytest.mark.parametrize("seed", range(6))
def test_latest_starts_keep_every_optimal_schedule(seed):
    from itertools import product

    from kvstudy.optimum.checker import InfeasibleSchedule

    inst = tiny(400 + seed, n=3, memory=(8, 14), prompt_max=3, arrival_max=4)
    T = inst.horizon()
    values = {}
    for start in product(*[range(int(a), T - int(o) + 1) for a, o in zip(inst.arrival, inst.output)]):
        try:
            values[start] = check(inst, np.array(start))
        except InfeasibleSchedule:
            pass
    opt = min(values.values())
    latest = latest_starts(inst, opt)
    optimal = [st for st, v in values.items() if v == opt]
    assert all((np.array(st) <= latest).all() for st in optimal)
    # and it does cut: some feasible schedule lies outside (else the test could not fail on a loose bound)
    assert any((np.array(st) > latest).any() for st in values)


def test_block_rows_lift_the_lp_relaxation():
    full = synthetic(1, np.random.default_rng(np.random.SeedSequence([0, 1]).spawn(1)[0]))
    inst = Instance(full.arrival[:10], full.prompt[:10], full.output[:10], full.capacity)
    bare, lifted = solve(inst, relax=True, blocks=False).bound, solve(inst, relax=True).bound
    opt = solve(inst, warm_start=starts(inst, MCSF()), time_limit=120)
    assert opt.proven_optimal
    # measured: bare LP 606, with block rows 791 = OPT (the bare LP sits 23% below)
    assert bare < 0.8 * opt.objective and 0.99 * opt.objective <= lifted <= opt.objective + 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("model", [1, 2])
def test_lns_improves_feasibly_and_deterministically(model):
    inst = synthetic(model, np.random.default_rng(3))
    mcsf = starts(inst, MCSF())
    one = improve(inst, mcsf, max_passes=1, node_limit=5_000)
    two = improve(inst, mcsf, max_passes=1, node_limit=5_000)
    assert np.array_equal(one.start, two.start)
    assert one.objective == check(inst, one.start) <= check(inst, mcsf) == one.initial
    # independent of checker.py: the schedule satisfies the IP's own rows (2)-(3) as built for HiGHS
    _, eq, mem, var_req, var_start, _ = build(inst)
    x = indicator(var_req, var_start, one.start)
    assert np.all(eq @ x == 1) and np.all(mem @ x <= inst.capacity)


def test_span_moves_reach_what_consecutive_windows_cannot():
    # Sec. 5.1 Arrival Model 2 draw 13 cut to 10 requests: MC-SF starts a 43-round request at round 1 and the
    # requests that should run before it sit far from it in start order; only the span moves free them together
    full = synthetic(2, np.random.default_rng(np.random.SeedSequence([0, 2]).spawn(14)[13]))
    inst = Instance(full.arrival[:10], full.prompt[:10], full.output[:10], full.capacity)
    mcsf = starts(inst, MCSF())
    windows = improve(inst, mcsf, max_passes=2)
    spans = improve(inst, mcsf, max_passes=2, span=40)
    assert spans.objective == check(inst, spans.start) < windows.objective == 330
    opt = solve(inst, warm_start=spans.start, time_limit=60)
    assert opt.proven_optimal and opt.objective == spans.objective == 261  # measured: span moves reach OPT
    assert np.array_equal(improve(inst, mcsf, max_passes=2, span=40).start, spans.start)  # deterministic


@pytest.mark.parametrize("span, most", [(-1, 8), (40, 1)])
def test_span_settings_out_of_range_are_refused(span, most):
    from kvstudy.errors import ConfigError

    inst = tiny(5)
    with pytest.raises(ConfigError, match="span"):
        improve(inst, starts(inst, MCSF()), span=span, span_most=most)


@pytest.mark.parametrize("blocks", [True, False])
def test_lp_bound_without_buckets_is_the_ip_relaxation(blocks):
    from kvstudy.optimum.lp_bound import lp_bound

    rng = np.random.default_rng(7)
    M = 20
    s = rng.integers(1, 4, 8)
    o = np.array([rng.integers(1, M - si + 1) for si in s])
    inst = Instance(np.zeros(8, int), s, o, M)
    assert lp_bound(inst, blocks=blocks).value == pytest.approx(solve(inst, relax=True, blocks=blocks).bound, rel=1e-7)


@pytest.mark.parametrize("seed", range(4))
def test_bucketed_lp_and_short_horizons_stay_below_the_optimum(seed):
    from kvstudy.optimum.lp_bound import lp_bound

    inst = tiny(300 + seed)
    opt = brute_force(inst)
    exact = lp_bound(inst).value
    assert exact <= opt + 1e-9
    for bucket, step, horizon in [(2, 1, None), (3, 2, None), (1, 1, 4), (2, 3, 6)]:
        assert lp_bound(inst, bucket=bucket, row_step=step, horizon=horizon).value <= exact + 1e-9


def test_gap_bound_at_scale_brackets_the_policy():
    from kvstudy.optimum.at_scale import gap_bound

    row = gap_bound(["+policy=mcsf", "+demand=high", "workload.num_requests=300"])
    assert row["n"] == 300 and row["lp_status"] == "optimal"
    assert row["best_bound"] <= row["policy_latency"] and row["ratio_at_most"] >= 1.0


def test_symmetry_breaking_among_identical_requests_keeps_the_optimum():
    from kvstudy.optimum.ip import sort_twins, twins

    # three identical requests (and a pair) all at round 0: many equal-cost orders of the same schedule
    inst = Instance(np.zeros(6, int), np.array([2, 1, 2, 2, 1, 3]), np.array([7, 4, 7, 7, 4, 5]), 14)
    assert sorted(twins(inst)) == [(0, 2), (1, 4), (2, 3)]
    warm = starts(inst, MCSF())
    reversed_twins = warm.copy()
    reversed_twins[[0, 2, 3]] = np.sort(warm[[0, 2, 3]])[::-1]
    assert check(inst, sort_twins(inst, reversed_twins)) == check(inst, reversed_twins)
    with_rows = solve(inst, warm_start=reversed_twins, time_limit=60)
    without = solve(inst, warm_start=reversed_twins, time_limit=60, symmetry=False)
    assert with_rows.proven_optimal and without.proven_optimal
    assert with_rows.objective == without.objective == check(inst, exact_by_branch(inst).start)
    s = with_rows.start
    assert s[0] <= s[2] <= s[3] and s[1] <= s[4]
