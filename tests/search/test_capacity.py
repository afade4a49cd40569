"""The capacity search (issue 58; kvstudy/search/capacity.py, kvstudy/search/criteria.py): bisection on a threshold
known exactly, a deployment whose capacity is computed by hand on the linear latency model, the statuses, and bad
input in one line."""
import pandas as pd
import pytest

from kvstudy.errors import ConfigError
from kvstudy.search.capacity import deployment_capacity, search_rate, summarise
from kvstudy.search.criteria import Goodput, Latency, SchedulingDelay, read_criterion


@pytest.mark.parametrize("threshold", [0.37, 3.0, 8.372, 123.4])
@pytest.mark.parametrize("start", [1.0, 50.0])
def test_bisection_brackets_a_known_threshold_within_its_tolerance(threshold, start):
    seen = []

    def measure(rate):
        seen.append(rate)
        return rate <= threshold, rate, "completed"

    out = search_rate(measure, start=start, tolerance=0.01)
    assert out.status == "found"
    assert out.capacity <= threshold < out.failing
    assert out.failing - out.capacity <= 0.01 * out.capacity
    assert len(seen) == len(out.probes) <= 40
    assert [p.rate for p in out.probes] == seen


def test_the_statuses_when_no_rate_or_every_rate_holds():
    never = search_rate(lambda r: (False, 9.0, "completed"), start=4.0, min_rate=0.5)
    assert never.status == "unreachable" and never.capacity is None and never.failing == 0.5
    always = search_rate(lambda r: (True, 0.0, "completed"), start=4.0, max_rate=20.0)
    assert always.status == "above_range" and always.capacity == 20.0 and always.failing is None
    assert summarise([never, always])["found"] == 0


D0, D1 = 0.02, 0.001


def test_a_capacity_computed_by_hand(tmp_path):
    """100 equal requests (prompt 100, one output token) one second apart, served one at a time (vLLM,
    max_num_seqs=1) in D0 + 100 D1 = 0.12 s each. Replayed r times faster (workload.rate_scale=r), request n waits
    n (0.12 - 1/r) once r > 1/0.12; the p90 of those (pandas' interpolation: at n = 89.1) is at most 0.05 s up to
    r* = 1 / (0.12 - 0.05 / 89.1) = 8.3723... The search with a 1% tolerance brackets it."""
    path = tmp_path / "t.csv"
    pd.DataFrame({"arrival_time": [float(k) for k in range(100)], "prompt_tokens": [100] * 100,
                  "output_tokens": [1] * 100}).to_csv(path, index=False)
    overrides = ["+policy=vllm", "policy.max_num_seqs=1", "memory=paged", "latency=linear", f"latency.d0={D0}",
                 f"latency.d1={D1}", "workload=trace", f"workload.path={path}"]
    criterion = SchedulingDelay(quantile=0.9, seconds=0.05)
    out = deployment_capacity(overrides, criterion, seeds=[0], knob="workload.rate_scale", start=2.0, tolerance=0.01)
    star = 1 / (0.12 - 0.05 / 89.1)
    search = out["searches"][0]
    assert search["status"] == "found"
    assert search["capacity"] <= star < search["failing"]
    assert star - search["capacity"] <= 0.01 * star
    assert out["mean"] == search["capacity"] and out["std"] == 0.0
    for p in search["probes"]:  # each probe's measured delay is the formula's
        assert p["value"] == pytest.approx(max(0.0, 89.1 * (0.12 - 1 / p["rate"])), abs=1e-9)


def test_a_deployment_that_meets_the_slo_at_no_rate_says_so(tmp_path):
    """Every request's TTFT is at least its own prefill, 0.12 s: a p50 TTFT <= 0.1 s is met at no rate."""
    path = tmp_path / "t.csv"
    pd.DataFrame({"arrival_time": [float(k) for k in range(20)], "prompt_tokens": [100] * 20,
                  "output_tokens": [1] * 20}).to_csv(path, index=False)
    overrides = ["+policy=vllm", "memory=paged", "latency=linear", f"latency.d0={D0}", f"latency.d1={D1}",
                 "workload=trace", f"workload.path={path}"]
    out = deployment_capacity(overrides, Latency("ttft", 0.5, 0.1), knob="workload.rate_scale", start=1.0,
                              min_rate=0.25)
    assert out["statuses"] == ["unreachable"] and out["found"] == 0 and "mean" not in out


@pytest.mark.parametrize("text, criterion", [
    ("scheduling_delay:quantile=0.99,seconds=2", SchedulingDelay(0.99, 2.0)),
    ("goodput:ttft=2.5,tpot=0.15,share=0.9", Goodput(2.5, 0.15, 0.9)),
    ("goodput", Goodput()),
    ("latency:metric=e2e,quantile=0.5,seconds=30", Latency("e2e", 0.5, 30.0)),
])
def test_criteria_read_from_text(text, criterion):
    assert read_criterion(text) == criterion


@pytest.mark.parametrize("text, message", [
    ("delay:seconds=2", "criterion='delay:seconds=2': unknown criterion 'delay'; allowed: scheduling_delay, goodput"),
    ("goodput:ttft=fast", "criterion='goodput:ttft=fast': ttft='fast' is not a number"),
    ("goodput:share=1.5", "share=1.5; allowed: a fraction in (0, 1]"),
    ("scheduling_delay:seconds=-1", "seconds=-1; allowed: seconds > 0"),
    ("latency:metric=tbt", "metric='tbt'; allowed: ttft, e2e"),
    ("latency:p=0.9", "'p=0.9' is not a setting of latency; allowed: metric=..., quantile=..., seconds=..."),
])
def test_a_bad_criterion_is_one_line(text, message):
    with pytest.raises(ConfigError) as err:
        read_criterion(text)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("settings, message", [
    ({"start": 0}, "search.start=0: allowed: a number > 0"),
    ({"start": 1, "tolerance": 2}, "search.tolerance=2: allowed: a fraction of the rate in (0, 1)"),
    ({"start": 5, "max_rate": 4}, "search.start=5: allowed: min_rate (0.01) <= start <= max_rate (4)"),
    ({"start": 1, "max_steps": 0}, "search.max_steps=0: allowed: a whole number >= 1"),
    ({"start": True}, "search.start=True: allowed: a number > 0"),
])
def test_bad_search_settings_are_one_line(settings, message):
    with pytest.raises(ConfigError) as err:
        search_rate(lambda r: (True, 0.0, "completed"), **settings)
    assert message in str(err.value)


def test_the_command_line_finds_the_hand_computed_capacity_and_writes_it(tmp_path, capsys):
    import json

    from kvstudy.search.__main__ import main

    path = tmp_path / "t.csv"
    pd.DataFrame({"arrival_time": [float(k) for k in range(100)], "prompt_tokens": [100] * 100,
                  "output_tokens": [1] * 100}).to_csv(path, index=False)
    out = tmp_path / "cap.json"
    code = main(["capacity", "--criterion", "scheduling_delay:quantile=0.9,seconds=0.05", "--knob",
                 "workload.rate_scale", "--start", "2", "--tolerance", "0.01", "--out", str(out), "--",
                 "+policy=vllm", "policy.max_num_seqs=1", "memory=paged", "latency=linear", f"latency.d0={D0}",
                 f"latency.d1={D1}", "workload=trace", f"workload.path={path}"])
    assert code == 0
    result = json.loads(out.read_text())
    star = 1 / (0.12 - 0.05 / 89.1)
    assert result["min"] <= star < result["searches"][0]["failing"]
    assert "capacity: mean" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["capacity"], "no deployment: give a run's overrides after --"),
    (["capacity", "--criterion", "fast", "--", "+policy=vllm"], "--criterion='fast': unknown criterion 'fast'"),
    (["capacity", "--seeds", "a,b", "--", "+policy=vllm"], "--seeds='a,b': allowed: whole numbers"),
    (["capacity", "--tolerance", "0", "--", "+policy=vllm"], "search.tolerance=0.0: allowed: a number > 0"),
])
def test_the_command_line_refuses_bad_input_in_one_line(argv, message, capsys):
    from kvstudy.search.__main__ import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_the_shipped_price_table_and_a_deployment_s_cost():
    from kvstudy.search.prices import hourly_cost, read_prices

    prices = read_prices()
    assert set(prices) == {"a100", "h100", "l4"}
    assert all(p.date == "2026-05-07" and "techbytes.app" in prices["a100"].source for p in prices.values())
    # four A100 TP=2 replicas: 8 GPUs; H100 prefill (TP=2) with three A100 decode replicas (TP=2)
    assert hourly_cost([("a100", 2, 1)] * 4, prices) == pytest.approx(8 * 2.4984)
    assert hourly_cost([("h100", 2, 1)] + [("a100", 2, 1)] * 3, prices) == pytest.approx(2 * 3.9492 + 6 * 2.4984)
    with pytest.raises(ConfigError, match="no price for GPU 'h200' in the price table"):
        hourly_cost([("h200", 2, 1)], prices)


@pytest.mark.parametrize("text, message", [
    ("gpu,usd_per_gpu_hour,source\na100,2,x\n", "no column 'date'"),
    ("gpu,usd_per_gpu_hour,source,date\nb200,2,x,2026-01-01\n", "row 2, gpu='b200': unknown GPU; allowed: a100"),
    ("gpu,usd_per_gpu_hour,source,date\na100,-2,x,2026-01-01\n", "row 2, usd_per_gpu_hour='-2': allowed: US dollars"),
    ("gpu,usd_per_gpu_hour,source,date\na100,cheap,x,2026-01-01\n", "usd_per_gpu_hour='cheap'"),
    ("gpu,usd_per_gpu_hour,source,date\na100,2,,2026-01-01\n", "row 2, source='': allowed: where the price"),
    ("gpu,usd_per_gpu_hour,source,date\na100,2,x,May 2026\n", "row 2, date='May 2026': allowed: the day"),
    ("gpu,usd_per_gpu_hour,source,date\na100,2,x,2026-01-01\na100,3,y,2026-01-02\n", "row 3, gpu='a100': a second"),
    ("gpu,usd_per_gpu_hour,source,date\n", "no rows"),
])
def test_a_bad_price_table_is_one_line(tmp_path, text, message):
    from kvstudy.errors import KvStudyError
    from kvstudy.search.prices import read_prices

    path = tmp_path / "prices.csv"
    path.write_text(text)
    with pytest.raises(KvStudyError) as err:
        read_prices(path)
    assert message in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_an_interrupted_simulation_stops_the_search_without_a_result(monkeypatch):
    """Ctrl-C inside a run ends it with status 'interrupted' (the engine keeps what it did); the search must not read
    that partial run as a probe: it stops (KeyboardInterrupt), and the grid writes nothing for the deployment."""
    from kvstudy import api

    from omegaconf import OmegaConf

    monkeypatch.setattr(api, "compose", lambda overrides: OmegaConf.create({"demand": {"rate": 1.0}}))
    monkeypatch.setattr(api, "simulate", lambda cfg: (None, {"status": "interrupted"}))
    with pytest.raises(KeyboardInterrupt):
        deployment_capacity(["+policy=vllm"], SchedulingDelay(), start=1.0)
