"""CacheOPT through kvstudy's API (its SLOs, calibration and costs; kvstudy/cacheopt/setup.py) and the study's
tables (kvstudy/cacheopt/study.py)."""
import numpy as np
import pandas as pd
import pytest

from kvstudy import api
from kvstudy.cacheopt import slo
from kvstudy.cacheopt import setup, study
from kvstudy.running import assemble

BASE = ["model=opt_13b", "hardware=a100_tp1", "latency=linear", "predictor=lognormal_noise", "workload=sharegpt",
        "+demand=table1_rate", "demand.scale=0.3", "memory=paged", "memory.capacity_tokens=20000",
        "memory.block_size=8", "workload.num_requests=80", "engine.progress=false"]


@pytest.fixture(scope="module")
def cacheopt_run():
    cfg = api.compose(BASE + ["+policy=cacheopt"])
    return cfg, api.simulate(cfg)


def test_slos_come_from_the_four_baselines_on_the_same_requests(cacheopt_run):
    cfg, (result, summary) = cacheopt_run
    runs = [api.simulate(api.compose(BASE + [f"+policy={p}"]))[0].requests for p in ("vllm", "rlp", "s3", "sarathi")]
    ttft_ref, tbt_ref = slo.reference(runs)
    info = result.extra["cacheopt"]["slo_reference"]
    assert (info["ttft"], info["tbt"]) == (ttft_ref, tbt_ref)
    req = result.requests.sort_values("request_id")
    arrival_order = np.argsort(req["arrival_time"].to_numpy(), kind="stable")
    tft, tbt = slo.draw_slos(req["prompt_tokens"].to_numpy()[arrival_order], ttft_ref, tbt_ref, 512, int(cfg.seed))
    assert np.allclose(req["slo_ttft"].to_numpy()[arrival_order], tft)
    assert np.allclose(req["slo_tbt"].to_numpy()[arrival_order], tbt)
    assert summary["status"] == "completed" and summary["completed"] == 80


def test_same_config_and_seed_give_identical_results(cacheopt_run):
    cfg, (result, _) = cacheopt_run
    again, _ = api.simulate(cfg)
    assert again.requests.equals(result.requests) and again.iterations.equals(result.iterations)


def test_direction_classifier_has_the_configured_accuracy():
    cfg = api.compose(BASE + ["+policy=cacheopt", "workload.num_requests=4000", "policy.direction_accuracy=0.7"])
    policy = api.build_policy(cfg)
    arch, _, _, _ = api.model_setup(cfg, latency=False)
    req, pred = api.build_requests(cfg, arch, np.random.SeedSequence(0))
    under = setup._directions(0, req.output_tokens, pred, policy.direction_accuracy)
    assert abs(np.mean(under == (req.output_tokens > pred)) - 0.7) < 0.03


def test_fixed_references_skip_the_baseline_runs(monkeypatch):
    # must not be called for the reference (run_context hands the policy assemble's simulate, not the facade's)
    monkeypatch.setattr(assemble, "simulate", None)
    cfg = api.compose(BASE + ["+policy=cacheopt", "policy.slo.ttft_ref=2.0", "policy.slo.tbt_ref=0.1"])
    assert setup.slo_reference(api.run_context(cfg, latency=False), api.build_policy(cfg)) == (2.0, 0.1)


def _frame(rows):
    cols = ["model", "hardware", "workload", "scale", "rate", "system", "seed", "ttft_p99", "ttft_p95", "worst_gap_p99",
            "worst_gap_p95", "ttft_attainment", "tbt_attainment", "normalized_latency", "policy_us_per_iteration"]
    df = pd.DataFrame(rows, columns=cols)
    df["tbt_p99"], df["tbt_p95"] = df["worst_gap_p99"] / 2, df["worst_gap_p95"] / 2  # pooled gaps: half the worst here
    return df


def test_ratios_and_sustainable_rate_by_hand():
    rows = []
    for rate, (co, vl) in {1.0: (0.10, 0.10), 2.0: (0.15, 0.30), 3.0: (0.25, 0.50)}.items():
        rows.append(["m", "h", "t", rate, rate, "cacheopt", 0, 1.0, 0.8, 0.2, 0.1, 0.9, 0.8, co, 10.0])
        rows.append(["m", "h", "t", rate, rate, "vllm", 0, 2.0, 1.6, 0.6, 0.3, 0.6, 0.4, vl, 5.0])
    m = _frame(rows)
    r = study.ratios(m)
    assert np.allclose(r["ttft_p99_ratio"], 2.0) and np.allclose(r["worst_gap_p99_ratio"], 3.0)
    assert np.allclose(r["tbt_p99_ratio"], 3.0)
    assert np.allclose(r["ttft_attainment_gain"], 0.3) and np.allclose(r["tbt_attainment_gain"], 0.4)
    s = study.sustainable(m).set_index("system")
    # target = 2 x 0.10 = 0.2: CacheOPT crosses it between 2 (0.15) and 3 (0.25) at 2.5; vLLM between 1 and 2 at 1.5
    assert s.loc["cacheopt", "sustainable_rate"] == pytest.approx(2.5)
    assert s.loc["vllm", "sustainable_rate"] == pytest.approx(1.5)
    assert s.loc["vllm", "cacheopt_over_this"] == pytest.approx(2.5 / 1.5)


def test_ablation_table_by_hand():
    m = _frame([["m", "h", "t", 1.0, 1.0, "cacheopt", 0, 1.0, 1.0, 0.5, 0.5, 0.9, 0.8, 0.1, 10.0],
                ["m", "h", "t", 1.0, 1.0, "cacheopt_wo_pa", 0, 2.0, 2.0, 1.0, 1.0, 0.45, 0.4, 0.2, 8.0]])
    row = study.ablation_table(m).iloc[0]
    assert row["variant"] == "/PA"
    assert row["tail_ttft_better_pct"] == pytest.approx(50) and row["tail_tbt_better_pct"] == pytest.approx(50)
    assert row["ttft_attainment_drop_pct"] == pytest.approx(50) and row["tbt_attainment_drop_pct"] == pytest.approx(50)
    assert row["worst_gap_better_pct"] == pytest.approx(50)
    assert row["overhead_less_pct"] == pytest.approx(20)


def test_metrics_of_a_small_sweep_score_every_system_against_the_same_slos(tmp_path):
    for p in ("vllm", "cacheopt"):
        cfg = api.compose(BASE + [f"+policy={p}", "workload.num_requests=40"])
        api.run(cfg, tmp_path / p)
    m = study.metrics(tmp_path)
    assert set(m["system"]) == {"vllm", "cacheopt"} and m["ttft_attainment"].notna().all()
    assert (m["tbt_p95"] <= m["tbt_p99"]).all() and (m["tbt_p95"] > 0).all()
    assert np.allclose(m["rate"], 28.0 * 0.3)


def test_intervals_are_95_percent_t_half_widths():
    # seeds 1, 2, 3: mean 2, sd 1, t(0.975, 2) = 4.303 -> half-width 4.303 / sqrt(3) = 2.484
    assert study.interval([1.0, 2.0, 3.0]) == pytest.approx(2.4841, abs=1e-4)
    assert study.interval([5.0]) == 0.0
    m = _frame([["m", "h", "t", 1.0, 1.0, "vllm", s, v, 0, 0, 0, 0, 0, 0, 0] for s, v in enumerate([1.0, 2.0, 3.0])])
    assert study.with_intervals(m, "ttft_p99").loc[("t", 1.0), "vllm"] == "2 ± 2.5"


def test_a_reference_with_no_completed_request_is_named_not_a_nan_slo():
    """A reference system that completed nothing (or only one-token outputs) gives a NaN mean: every SLO and the
    deadline order would be NaN (kvstudy/cacheopt/queue.py cannot order them), so the set-up says so."""
    import pandas as pd
    from kvstudy.errors import ConfigError

    done = pd.DataFrame({"state": ["done", "done"], "ttft": [1.0, 3.0], "mean_tbt": [0.1, 0.3]})
    assert slo.reference([done]) == (2.0, pytest.approx(0.2))
    nothing = done.assign(state=["rejected", "rejected"])
    with pytest.raises(ConfigError, match=r"TTFT_ref=nan, TBT_ref=nan .*give policy.slo.ttft_ref and policy.slo.tbt_ref"):
        slo.reference([done, nothing])
    one_token = done.assign(mean_tbt=[float("nan")] * 2)
    with pytest.raises(ConfigError, match=r"TBT_ref=nan"):
        slo.reference([one_token])
