"""Hindsight optimum: the IP matches exhaustive search, every schedule passes the independent checker,
time-limited runs are never called optimal, bounds are valid, Theorem 4.1's instance forces growth."""
import numpy as np
import pytest

from kvstudy.errors import DataError
from kvstudy.optimum.adversary import ratio_lower_bound
from kvstudy.optimum.bounds import volume_bound
from kvstudy.optimum.checker import InfeasibleSchedule, check
from kvstudy.optimum.instance import Instance, synthetic
from kvstudy.optimum.ip import brute_force, solve
from kvstudy.optimum.online import starts
from kvstudy.policies.mcsf import MCSF
from tests.instances import tiny


def test_unservable_request_is_rejected_by_name():
    with pytest.raises(DataError, match=r"request 1 needs s \+ o = 5 \+ 8 = 13 KV tokens .* more than M = 12"):
        Instance(np.zeros(2, int), np.array([2, 5]), np.array([3, 8]), 12)


def test_checker_catches_violations():
    inst = Instance(np.array([0, 2]), np.array([3, 3]), np.array([4, 4]), 10)
    assert check(inst, [0, 4]) == 4 + (4 + 4 - 2)
    with pytest.raises(InfeasibleSchedule, match="before its arrival"):
        check(inst, [0, 1])
    with pytest.raises(InfeasibleSchedule, match=r"round \d+ uses \d+ tokens > M = 10"):
        check(inst, [0, 2])


@pytest.mark.parametrize("seed", range(6))
def test_ip_matches_exhaustive_search_on_tiny_instances(seed):
    inst = tiny(seed)
    warm = starts(inst, MCSF())
    res = solve(inst, warm_start=warm, time_limit=30)
    assert res.proven_optimal
    assert res.objective == brute_force(inst) == check(inst, res.start)
    assert res.objective <= check(inst, warm)
    assert volume_bound(inst) <= res.objective + 1e-9


def test_issue_counterexample_optimum_is_312():
    inst = Instance(np.zeros(7, int), np.array([4, 5, 3, 4, 5, 2, 1]), np.array([14, 13, 41, 42, 1, 24, 40]), 49)
    res = solve(inst, warm_start=starts(inst, MCSF()), time_limit=120)
    assert res.proven_optimal and res.objective == 312
    assert int((res.start + inst.output).max()) == 123


def test_time_limit_is_reported_never_optimal():
    inst = synthetic(1, np.random.default_rng(0))
    warm = starts(inst, MCSF())
    res = solve(inst, warm_start=warm, time_limit=1.0)
    assert res.status == "time_limit" and not res.proven_optimal
    assert res.bound <= res.objective <= check(inst, warm)
    assert 0 < res.gap < 1


def test_synthetic_generators_follow_section_5_1():
    rng = np.random.default_rng(1)
    for _ in range(20):
        one = synthetic(1, rng)
        assert 30 <= one.capacity <= 50 and 40 <= one.n <= 60 and (one.arrival == 0).all()
        assert one.prompt.min() >= 1 and one.prompt.max() <= 5 and (one.output <= one.capacity - one.prompt).all()
        two = synthetic(2, rng)
        assert two.arrival.max() < 60 and np.all(np.diff(two.arrival) >= 0)


def test_theorem_4_1_ratio_grows():
    rows = [ratio_lower_bound(MCSF, M) for M in (64, 256, 1024)]
    ratios = [r["ratio_at_least"] for r in rows]
    assert ratios[0] < ratios[1] < ratios[2] and ratios[2] > 3


def test_gurobi_path_agrees_with_highs_on_a_tiny_instance():
    pytest.importorskip("gurobipy", reason="gurobipy is an optional solver (pip install gurobipy)")
    inst = Instance(np.array([0, 0, 1]), np.array([1, 2, 1]), np.array([3, 2, 4]), 7)
    warm = starts(inst, MCSF())
    ours = solve(inst, warm_start=warm, time_limit=30)
    theirs = solve(inst, warm_start=warm, time_limit=30, solver="gurobi")
    assert theirs.proven_optimal and theirs.objective == ours.objective == brute_force(inst)


def test_unknown_solver_is_named():
    inst = Instance(np.array([0]), np.array([1]), np.array([1]), 4)
    with pytest.raises(Exception, match="solver='cplex': allowed 'highs' or 'gurobi'"):
        solve(inst, solver="cplex")


def algorithm_1(inst: Instance) -> np.ndarray:
    """MC-SF read directly off Alg. 1 in the IP's memory convention, independent of the engine: each round, waiting
    requests in ascending o; admit while every future round still fits M; stop at the first that does not."""
    memory = np.zeros(inst.horizon() + 2, dtype=np.int64)
    start = np.full(inst.n, -1)
    t = 0
    while (start < 0).any():
        waiting = sorted((i for i in range(inst.n) if start[i] < 0 and inst.arrival[i] <= t),
                         key=lambda i: (inst.output[i], i))
        for i in waiting:
            rounds = np.arange(t + 1, t + inst.output[i] + 1)
            need = inst.prompt[i] + rounds - t
            if np.any(memory[rounds] + need > inst.capacity):
                break
            memory[rounds] += need
            start[i] = t
        t += 1
    return start


@pytest.mark.parametrize("model,seed", [(1, 0), (1, 1), (2, 0), (2, 1)])
def test_engine_mcsf_matches_a_direct_reading_of_algorithm_1(model, seed):
    inst = synthetic(model, np.random.default_rng([seed, model]))
    assert np.array_equal(starts(inst, MCSF()), algorithm_1(inst))


def test_highs_proves_by_absolute_gap_below_one_not_relative_gap():
    # at paper sizes HiGHS's default relative gap (1e-4) exceeds one latency unit: optimality must mean gap < 1
    from kvstudy.optimum.ip import build, highs_model

    inst = tiny(5)
    cost, eq, mem, *_rest, constant = build(inst)
    h, _ = highs_model(cost, eq, mem, inst.capacity, constant, upper=1.0, integer=True, time_limit=5)
    assert h.getOptionValue("mip_rel_gap")[1] == 0.0
    assert 0.99 < h.getOptionValue("mip_abs_gap")[1] < 1.0


def test_study_runs_the_exact_method_only_up_to_exact_max_n():
    from kvstudy.optimum.study import study

    skipped = study(1, trials=1, time_limit=5, cut=6, exact_max_n=5)
    solved = study(1, trials=1, time_limit=5, cut=6, exact_max_n=6)
    assert skipped["ip_status"].tolist() == ["skipped"] and not skipped["proven_optimal"].any()
    assert solved["proven_optimal"].all() and solved["incumbent"].iloc[0] <= skipped["incumbent"].iloc[0]
