"""regime=authors: kvstudy runs what the MC-SF authors' scripts run, request by request.

``tests/authors_reference.py`` is an independent, plain event simulation of the four real-data scripts
(``anonymouspeople111/neurips2025-code``), written from reading them without kvstudy's engine or policies; here
kvstudy's engine under ``regime=authors`` must give every request the completion time the reference gives it
(to 1e-6 s) on the same requests. Plus: the batch-time formula by hand, the scripts' look-ahead rounding, the
event order on ties, and that the regime changes nothing it should not.
"""
import math

import numpy as np
import pytest

from kvstudy import api
from kvstudy.engine import Engine
from kvstudy.errors import ConfigError
from kvstudy.latency.models import McsfAuthorsLatency
from kvstudy.policies.mcsf import MCSF, MCBenchmark
from kvstudy.policies.memory_check import AuthorsCheck, FutureMemory, authors_steps
from tests import authors_reference
from tests.conftest import make_instance

POLICY = {"mcsf": ["+policy=mcsf"], "mc_benchmark": ["+policy=mc_benchmark"],
          "alpha_greedy": ["+policy=alpha_greedy", "policy.alpha=0.3"],
          "alpha_beta": ["+policy=alpha_beta", "policy.alpha=0.2", "policy.beta=0.1"]}


def run_both(algorithm, seed, n, capacity, demand="high", extra=(), batch_cap=None):
    cfg = api.compose([*POLICY[algorithm], f"+demand={demand}", "regime=authors", f"seed={seed}",
                       f"workload.num_requests={n}", f"memory.capacity_tokens={capacity}", "engine.progress=false",
                       # no request with s + o + 1 > M: the scripts would queue it forever (kvstudy rejects it up front;
                       # at the paper's M = 16,492 no request of a 4,096-token model can be one)
                       f"workload.max_total_tokens={min(capacity - 1, 4096)}", *extra])
    result, _ = api.simulate(cfg)
    req = result.requests.sort_values("request_id")
    kw = {}
    if algorithm.startswith("alpha"):
        kw = {"alpha": float(cfg.policy.alpha), "beta": cfg.policy.beta, "seed": seed}
    ref = authors_reference.simulate(algorithm, req.arrival_time.tolist(), req.prompt_tokens.tolist(),
                                     req.output_tokens.tolist(), capacity, avg_batch_time=0.05, batch_cap=batch_cap,
                                     **kw)
    return result, req, ref


def assert_same_completions(req, ref):
    ours = req.completion_time.to_numpy()
    theirs = np.array([np.nan if c is None else c for c in ref["completion"]])
    assert np.array_equal(np.isnan(ours), np.isnan(theirs)), "different requests completed"
    done = ~np.isnan(ours)
    worst = float(np.max(np.abs(ours[done] - theirs[done]))) if done.any() else 0.0
    assert worst <= 1e-6, f"completion times differ by up to {worst:.3g} s"


@pytest.mark.parametrize("algorithm", ["mcsf", "mc_benchmark"])
@pytest.mark.parametrize("seed,n,capacity,demand", [(0, 150, 3000, "high"), (1, 200, 2000, "high"),
                                                    (2, 120, 16492, "high"), (3, 150, 2500, "low"),
                                                    (4, 80, 1500, "offline")])
def test_mcsf_family_matches_the_scripts_request_by_request(algorithm, seed, n, capacity, demand):
    result, req, ref = run_both(algorithm, seed, n, capacity, demand)
    assert result.status == "completed" and ref["status"] == "completed"
    assert_same_completions(req, ref)
    assert len(result.iterations) == ref["batches"]


@pytest.mark.parametrize("seed,capacity", [(0, 3000), (5, 2500)])
def test_alpha_beta_matches_the_script_request_by_request(seed, capacity):
    result, req, ref = run_both("alpha_beta", seed, 150, capacity)
    assert ref["resets"] > 0, "the instance must overflow to test the clearing"
    assert result.clearing_events == ref["resets"]
    assert_same_completions(req, ref)


def test_alpha_greedy_matches_the_script_where_it_terminates():
    # the whole queue is admitted whenever the running KV is within (1 - alpha) M: on a roomy cache it never
    # overflows, and the schedule (every waiting prompt in each batch) is the script's
    result, req, ref = run_both("alpha_greedy", 0, 300, 8000, demand="low")
    assert result.status == "completed" and ref["status"] == "completed"
    assert_same_completions(req, ref)


def test_alpha_greedy_whole_queue_admission_livelocks_like_the_script():
    # B (the scripts' batch cap) is undefined, taken as no cap: after a reset the whole queue is admitted at once,
    # overflows again and is cleared again; the script spins (here until max_batches), kvstudy ends no_progress
    cfg = api.compose(["+policy=alpha_greedy", "+demand=low", "regime=authors", "workload.num_requests=150",
                       "memory.capacity_tokens=4000", "workload.max_total_tokens=3999", "engine.progress=false",
                       "engine.stall_limit=50"])
    result, summary = api.simulate(cfg)
    assert summary["status"] == "no_progress" and result.clearing_events >= 50
    req = result.requests
    ref = authors_reference.simulate("alpha_greedy", req.arrival_time.tolist(), req.prompt_tokens.tolist(),
                                     req.output_tokens.tolist(), 4000, alpha=0.3, max_batches=3000)
    assert ref["status"] == "max_batches" and ref["resets"] > 2000
    # every request kvstudy completed before the livelock, the script completed at the same time
    done = req.completion_time.notna().to_numpy()
    assert done.any()
    theirs = np.array([np.nan if c is None else c for c in ref["completion"]])
    assert np.allclose(req.completion_time.to_numpy()[done], theirs[done], rtol=0, atol=1e-6)


def test_formula_by_hand():
    lat = McsfAuthorsLatency()
    # two prompts (30 and 10 tokens) and three decodes that have produced 1, 4 and 7 tokens: B = 5, c = 12 / 5
    ms = (0.0027 * 2.4 + 0.52) * 5 + 44.6 + 0.378 * 40
    assert lat.iteration_seconds([(30, 0), (10, 0)], 3, 999, decode_generated_sum=12) == ms / 1000
    assert math.isclose(lat.iteration_seconds([], 1, 0, decode_generated_sum=1), 0.0451227)
    with pytest.raises(TypeError):  # decodes without their produced tokens
        lat.iteration_seconds([], 1, 0)
    assert lat.iteration_seconds([(100, 0)], 0, 0) == ((0.0027 * 0.0 + 0.52) * 1 + 44.6 + 0.378 * 100) / 1000
    with pytest.raises(ConfigError, match="latency.intercept_ms"):
        McsfAuthorsLatency(intercept_ms=float("nan"))


def test_the_engines_give_the_formula_the_produced_tokens():
    # paper loop: one request, s = 5, o = 3: a prompt batch, then decodes that have produced 1 and 2 tokens
    req = make_instance([5], [3])
    res = Engine(req, req.output_tokens, MCSF(), McsfAuthorsLatency(), 100).run()
    got = res.iterations["duration"].tolist()
    want = [((0.0027 * 0 + 0.52) * 1 + 44.6 + 0.378 * 5) / 1000] + [
        ((0.0027 * c + 0.52) * 1 + 44.6) / 1000 for c in (1, 2, 3)]
    assert got == want
    # paged loop: first token from the prefill, then decodes that have produced 1 and 2 tokens
    cfg = api.compose(["+policy=vllm", "+demand=offline", "latency=mcsf_authors", "workload.num_requests=1",
                       "engine.progress=false"])
    result, _ = api.simulate(cfg)
    s = int(result.requests.prompt_tokens[0])
    o = int(result.requests.output_tokens[0])
    want = [((0.52) * 1 + 44.6 + 0.378 * s) / 1000] + [((0.0027 * c + 0.52) * 1 + 44.6) / 1000 for c in range(1, o)]
    assert np.allclose(result.iterations["duration"].to_numpy(), want, rtol=0, atol=1e-15)


def test_lookahead_rounding_is_pythons_float_arithmetic():
    rng = np.random.default_rng(0)
    for _ in range(200):
        now = float(rng.uniform(0, 500))
        pts = rng.integers(1, 2000, 50)
        got = authors_steps(now, 0.05)(pts)
        want = [int((now + int(k) * 0.05 - now) // 0.05) for k in pts]
        assert got.tolist() == want
    # the rounding credits one token less at about half the points with 0.05 s
    assert authors_steps(1.0, 0.05)(np.array([3]))[0] == 2


def test_authors_check_counts_a_request_at_its_completion_instant():
    # a running request after its prompt (s = 10, o = 2, no decode yet) holds 11 now and 12 at its last decode; a
    # new prompt (s = 3, o = 5) holds 3 + k after k batches. Eq. (5): 12 + 4 = 16 at tau = 1, then 8: fits M = 16.
    # The scripts also count the running one at the instant it completes (13 = s + o + 1): 13 + 5 = 18 at k = 2.
    w, d = np.array([11]), np.array([1])  # eq. (5)'s terms: w = s + j + 1, d = o - j - 1
    assert FutureMemory(16, w, d).try_add(3, 5)
    assert not AuthorsCheck(17, w, d, now=0.0, batch_time=0.0625).try_add(3, 5)  # 1/16 s: no rounding
    assert AuthorsCheck(18, w, d, now=0.0, batch_time=0.0625).try_add(3, 5)


def test_event_order_on_ties():
    # two requests arrive together on an idle engine: the scripts batch the first alone; the paper's order both
    req = make_instance([5, 5], [2, 2], arrival=np.array([0.0, 0.0]))
    lat = McsfAuthorsLatency()
    together = Engine(req, req.output_tokens, MCSF(), lat, 100).run().requests
    assert together.first_scheduled_time.tolist() == [0.0, 0.0]
    alone = Engine(req, req.output_tokens, MCSF(), lat, 100, arrivals="authors_code").run().requests
    assert alone.first_scheduled_time[0] == 0.0 and alone.first_scheduled_time[1] > 0.0
    ref = authors_reference.simulate("mcsf", [0.0, 0.0], [5, 5], [2, 2], 100)
    assert alone.completion_time.tolist() == ref["completion"]


def test_regime_sets_every_key_and_each_key_stands_alone():
    cfg = api.compose(["+policy=mcsf", "regime=authors"])
    assert (cfg.latency.name, cfg.policy.admission, cfg.engine.arrivals, cfg.engine.overflow_cost) == (
        "mcsf_authors", "authors_code", "authors_code", "authors_code")
    default = api.compose(["+policy=mcsf"])
    assert (default.latency.name, default.policy.admission, default.engine.arrivals, default.engine.overflow_cost) == (
        "vidur", "paper", "paper", "batch")
    mixed = api.compose(["+policy=mcsf", "regime=authors", "latency=vidur"])
    assert mixed.latency.name == "vidur" and mixed.policy.admission == "authors_code"
    alone = api.compose(["+policy=mc_benchmark", "policy.admission=authors_code"])
    assert alone.latency.name == "vidur" and alone.policy.admission == "authors_code"
    for bad in (["+policy=mcsf", "policy.admission=script"], ["+policy=mcsf", "policy.avg_batch_time=0"]):
        with pytest.raises(ConfigError, match="policy.a"):
            api.simulate(api.compose(bad + ["workload.num_requests=5", "+demand=high", "latency=unit"]))


def test_mcsf_policies_refuse_a_tiny_batch_time():
    with pytest.raises(ConfigError, match="avg_batch_time"):
        MCBenchmark(admission="authors_code", avg_batch_time=1e-7)


@pytest.mark.parametrize("algorithm,cap,seed,capacity", [("alpha_greedy", 24, 1, 2500), ("alpha_greedy", 32, 1, 3000),
                                                         ("alpha_beta", 24, 2, 2500), ("alpha_beta", 64, 1, 3000)])
def test_alpha_scripts_with_a_batch_cap_match_request_by_request(algorithm, cap, seed, capacity):
    # B given (engine.max_batch): decodes first, lowest ids (the reference's choice for the scripts' set order),
    # then prompts in arrival order up to B
    result, req, ref = run_both(algorithm, seed, 200, capacity, extra=[f"engine.max_batch={cap}"], batch_cap=cap)
    assert result.status == "completed" and ref["status"] == "completed"
    assert (result.iterations["batch_size"] <= cap).all() and (result.iterations["batch_size"] == cap).any()
    assert result.clearing_events == ref["resets"] > 0
    assert_same_completions(req, ref)


def test_batch_cap_is_refused_where_it_means_nothing():
    with pytest.raises(ConfigError, match="engine.max_batch"):
        api.simulate(api.compose(["+policy=vllm", "+demand=high", "workload.num_requests=5", "engine.max_batch=4",
                                  "latency=unit"]))
    with pytest.raises(Exception, match="engine.max_batch=0"):
        api.simulate(api.compose(["+policy=mcsf", "+demand=high", "workload.num_requests=5", "engine.max_batch=0",
                                  "latency=unit"]))


@pytest.mark.parametrize("override", ["engine.arrivals=authors_code", "policy.admission=authors_code",
                                      "engine.overflow_cost=authors_code", "engine.overflow_cost=free",
                                      "engine.max_batch=1e3"])
def test_each_piece_of_the_regime_is_a_known_key_on_the_command_line(override):
    # keys whose defaults are interpolations (${regime...}) are keys like any other for the command line's checks
    from kvstudy.config.validate import check_overrides

    check_overrides(["+policy=alpha_greedy", override])
    cfg = api.compose(["+policy=alpha_greedy", "+demand=high", "workload.num_requests=30", "latency=unit",
                       "engine.progress=false", override])
    assert api.simulate(cfg)[1]["status"] == "completed"


def test_the_regime_is_refused_on_paged_memory():
    with pytest.raises(ConfigError, match="engine.arrivals=authors_code"):
        api.simulate(api.compose(["+policy=vllm", "+demand=high", "workload.num_requests=5", "regime=authors"]))
    cfg = api.compose(["+policy=vllm", "+demand=high", "workload.num_requests=5", "latency=mcsf_authors",
                       "engine.progress=false"])
    assert api.simulate(cfg)[1]["status"] == "completed"
