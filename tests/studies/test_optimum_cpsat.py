"""CP-SAT on the IP (cpsat.py), in each of its memory formulations: agrees with exhaustive search where it
claims a proof, its schedules pass the checker, it never returns worse than it was given, it is deterministic,
and it refuses bad settings and a missing OR-Tools with a message that says what to do."""
import functools

import numpy as np
import pandas as pd
import pytest

from kvstudy.errors import ConfigError
from kvstudy.optimum import cpsat
from kvstudy.optimum.checker import check, memory_use
from kvstudy.optimum.instance import Instance, synthetic
from kvstudy.optimum.ip import brute_force
from kvstudy.optimum.lns import improve as lns
from kvstudy.optimum.online import starts
from kvstudy.optimum.study import study
from kvstudy.policies.mcsf import MCSF
from tests.instances import tiny

needs_ortools = pytest.mark.skipif(not cpsat.available(), reason="OR-Tools not installed (pip install -e '.[cpsat]')")


def draw(model: int, trial: int, cut: int) -> Instance:
    inst = synthetic(model, np.random.default_rng(np.random.SeedSequence([0, model]).spawn(trial + 1)[trial]))
    return Instance(inst.arrival[:cut], inst.prompt[:cut], inst.output[:cut], inst.capacity)


@functools.lru_cache(maxsize=None)
def exhaustive(seed: int) -> int:
    """The exhaustive search's optimum of ``tiny(300 + seed, ...)``, once per seed for the three formulations
    (seed 2's takes ~13 s of CPU; issue 54, item 4)."""
    return brute_force(tiny(300 + seed, n=4, memory=(8, 12)))


@pytest.mark.slow
@needs_ortools
@pytest.mark.parametrize("formulation", cpsat.FORMULATIONS)
# a seed's formulations on one pytest-xdist worker, where ``exhaustive`` has its optimum
@pytest.mark.parametrize("seed", [pytest.param(s, marks=pytest.mark.xdist_group(f"cpsat_exhaustive_{s}"))
                                  for s in range(4)])
def test_cpsat_proofs_match_exhaustive_search(seed, formulation):
    inst = tiny(300 + seed, n=4, memory=(8, 12))
    res = cpsat.improve(inst, starts(inst, MCSF()), work=2, formulation=formulation)
    assert res.proven_optimal
    assert res.objective == check(inst, res.start) == exhaustive(seed)
    assert res.bound <= res.objective


@pytest.mark.slow
@needs_ortools
@pytest.mark.parametrize("seed", range(6))
def test_completion_rows_alone_are_exactly_the_memory_constraint(seed):
    # staggered arrivals, larger prompts: the completion rows must not cut off the optimum, and a peak they
    # missed would let CP-SAT return a schedule the checker rejects
    inst = tiny(500 + seed, n=4, memory=(8, 12), prompt_max=3, arrival_max=4)
    res = cpsat.improve(inst, starts(inst, MCSF()), work=5, formulation="completion")
    assert res.proven_optimal and res.objective == check(inst, res.start) == brute_force(inst)


def test_memory_peaks_in_completion_rounds():
    # the fact the completion rows rest on (cpsat._completion_rows): over any schedule, the most memory held in
    # any round is held in some request's completion round S + o
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 8))
        inst = Instance(np.zeros(n, dtype=np.int64), rng.integers(1, 6, n), rng.integers(1, 30, n), 10**6)
        start = rng.integers(0, 40, n)
        memory = memory_use(inst, start, int((start + inst.output).max()) + 1)
        assert memory.max() == memory[start + inst.output].max()


def test_cpsat_refuses_an_unknown_formulation():
    inst = tiny(1)
    with pytest.raises(ConfigError, match=r"cpsat formulation 'cumulativ': allowed cumulative, completion, both"):
        cpsat.improve(inst, starts(inst, MCSF()), work=1, formulation="cumulativ")


@pytest.mark.slow
@needs_ortools
def test_cpsat_reaches_what_lns_windows_miss_and_is_deterministic():
    # Arrival Model 2 draw 13 cut to 10 requests: MC-SF 332, LNS windows 330, OPT 261 (proven by the IP,
    # test_optimum_search.test_span_moves_reach_what_consecutive_windows_cannot)
    inst = draw(2, 13, 10)
    mcsf = starts(inst, MCSF())
    assert lns(inst, mcsf, window=5, max_passes=2).objective == 330
    first = cpsat.improve(inst, mcsf, work=5)
    again = cpsat.improve(inst, mcsf, work=5)
    assert first.initial == 332 and first.objective == check(inst, first.start) == 261
    assert first.proven_optimal
    assert np.array_equal(first.start, again.start) and first.bound == again.bound


@needs_ortools
def test_cpsat_never_returns_worse_than_its_start():
    inst = synthetic(2, np.random.default_rng(np.random.SeedSequence([0, 2]).spawn(1)[0]))
    mcsf = starts(inst, MCSF())
    res = cpsat.improve(inst, mcsf, work=0.05)
    assert res.objective == check(inst, res.start) <= check(inst, mcsf)
    assert res.bound <= res.objective and not res.proven_optimal


@pytest.mark.parametrize("work", [0, -1.0, float("nan"), float("inf")])
def test_cpsat_refuses_a_bad_budget(work):
    inst = tiny(1)
    with pytest.raises(ConfigError, match="cpsat work"):
        cpsat.improve(inst, starts(inst, MCSF()), work=work)


def test_cpsat_without_ortools_says_how_to_install(monkeypatch):
    monkeypatch.setattr(cpsat, "available", lambda: False)
    inst = tiny(1)
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[cpsat\]'"):
        cpsat.improve(inst, starts(inst, MCSF()), work=1)


def test_cpsat_refuses_an_infeasible_start():
    inst = Instance(np.zeros(2, int), np.array([1, 1]), np.array([8, 8]), 10)
    with pytest.raises(ValueError, match="tokens > M"):
        cpsat.improve(inst, np.array([0, 0]), work=1)


@pytest.fixture(scope="module")
def by_ip():
    """The IP's proven optima of two 6-request Model 2 cuts, for the CP-SAT studies to match."""
    return study(2, trials=2, time_limit=30, cut=6)


@needs_ortools
def test_study_counts_a_cpsat_proof_and_matches_the_ip(by_ip):
    by_cpsat = study(2, trials=2, time_limit=5, cut=6, cpsat=5)
    assert by_cpsat["ip_status"].tolist() == ["optimal (cpsat)"] * 2 and by_cpsat["proven_optimal"].all()
    assert by_ip["proven_optimal"].all()
    assert by_cpsat["incumbent"].tolist() == by_ip["incumbent"].tolist()
    assert (by_cpsat["bound"] == by_cpsat["incumbent"]).all()


@needs_ortools
def test_study_cli_runs_the_completion_formulation(tmp_path, by_ip):
    from kvstudy.optimum.__main__ import main

    out = tmp_path / "c.parquet"
    args = ["study", "--model", "2", "--trials", "2", "--cut", "6", "--time-limit", "0", "--cpsat", "5",
            "--cpsat-formulation", "completion", "--out", str(out)]
    assert main(args) == 0
    df = pd.read_parquet(out)
    assert df["cpsat_formulation"].tolist() == ["completion"] * 2 and df["proven_optimal"].all()
    assert by_ip["proven_optimal"].all() and df["incumbent"].tolist() == by_ip["incumbent"].tolist()


def test_study_cli_refuses_a_negative_cpsat_budget(capsys):
    from kvstudy.optimum.__main__ import main

    assert main(["study", "--model", "1", "--trials", "1", "--cpsat", "-2"]) == 2  # one error: line, status 2
    assert "--cpsat -2.0: allowed 0 (off)" in capsys.readouterr().err


def test_study_keeps_going_when_one_cpsat_child_fails(monkeypatch):
    def killed(*args, **kwargs):
        raise ConfigError("cpsat: the CP-SAT child failed (exit -9): no message")

    monkeypatch.setattr(cpsat, "available", lambda: True)
    monkeypatch.setattr(cpsat, "improve", killed)
    df = study(2, trials=2, time_limit=0, cut=6, cpsat=1)
    assert len(df) == 2 and df["cpsat_status"].str.startswith("error: cpsat: the CP-SAT child failed").all()
    assert (df["incumbent"] == df["mcsf"]).all() and not df["proven_optimal"].any()


def test_study_without_ortools_stops_before_the_first_trial(monkeypatch):
    monkeypatch.setattr(cpsat, "available", lambda: False)
    with pytest.raises(ConfigError, match="study --cpsat needs OR-Tools"):
        study(2, trials=2, time_limit=0, cut=6, cpsat=1)


@pytest.mark.parametrize("work", [float("nan"), float("inf"), -1.0])
def test_study_refuses_a_bad_cpsat_budget_before_the_first_trial(work):
    with pytest.raises(ConfigError, match="study --cpsat work"):
        study(2, trials=2, time_limit=0, cut=6, cpsat=work)


def _crash_first(monkeypatch, crashes: int, code: int = -11):
    """Make the first ``crashes`` CP-SAT children end with ``code`` (-11: killed by SIGSEGV) before running."""
    real = cpsat.subprocess.run
    calls = []

    def run(*args, **kwargs):
        calls.append(1)
        if len(calls) <= crashes:
            return cpsat.subprocess.CompletedProcess(args[0], code, "", "Segmentation fault")
        return real(*args, **kwargs)

    monkeypatch.setattr(cpsat.subprocess, "run", run)
    return calls


@needs_ortools
def test_cpsat_runs_a_crashed_child_once_more_and_gets_the_same_result(monkeypatch):
    inst = draw(2, 3, 7)
    start = starts(inst, MCSF())
    clean = cpsat.improve(inst, start, 2.0)
    calls = _crash_first(monkeypatch, 1)
    again = cpsat.improve(inst, start, 2.0)
    assert len(calls) == 2
    assert (again.objective, again.status, again.bound) == (clean.objective, clean.status, clean.bound)
    assert (again.start == clean.start).all()


@needs_ortools
@pytest.mark.parametrize("crashes, code, calls_made, message", [
    (2, -11, 2, r"exit -11\) on each of 2 tries: Segmentation fault"),
    (1, -9, 1, r"exit -9\): Segmentation fault"),  # killed (out of memory): not retried
])
def test_cpsat_reports_a_child_that_keeps_crashing_or_was_killed(monkeypatch, crashes, code, calls_made, message):
    inst = draw(2, 3, 7)
    calls = _crash_first(monkeypatch, crashes, code)
    with pytest.raises(ConfigError, match=message):
        cpsat.improve(inst, starts(inst, MCSF()), 2.0)
    assert len(calls) == calls_made
