"""The grid search (issue 58; kvstudy/search/grid.py): deployments skipped with their reasons (over the budget, no
price, weights that do not fit), a capacity for the rest, resume without searching again, the Pareto frontier, and a
bad spec in one line."""
import math

import pandas as pd
import pytest

from kvstudy.errors import ConfigError
from kvstudy.search import grid as grid_module
from kvstudy.search.grid import best, read_spec, results_table, run_grid
from kvstudy.search.prices import read_prices


def _spec(tmp_path, body: str):
    trace = tmp_path / "t.csv"
    pd.DataFrame({"arrival_time": [0.0] * 200, "prompt_tokens": [200] * 200,
                  "output_tokens": [100] * 200}).to_csv(trace, index=False)
    path = tmp_path / "spec.yaml"
    path.write_text(body.replace("TRACE", str(trace)))
    return path


SPEC = """
overrides: [model=llama2_70b, latency=linear, memory=paged, memory.capacity_tokens=auto, workload=trace,
            workload.path=TRACE, +demand=high]
criterion: scheduling_delay:quantile=0.9,seconds=0.2
gpu_budget: 2
search: {start: 1.0, tolerance: 0.1, max_rate: 64}
grid:
  hardware: [a100_tp1, a100_tp2, h200_tp2]
  replicas: [1, 2]
  policies:
    vllm: [{}]
"""


def test_a_grid_skips_with_reasons_finds_capacities_and_resumes(tmp_path, monkeypatch):
    spec = read_spec(_spec(tmp_path, SPEC))
    assert len(spec.deployments) == 6
    out = tmp_path / "out"
    lines = []
    table = run_grid(spec, out, read_prices(), log=lines.append).set_index("key")
    assert "does not fit on hardware 'a100_tp1'" in table.loc["a100_tp1-x1-vllm--", "reason"]
    assert "does not fit on hardware 'a100_tp1'" in table.loc["a100_tp1-x2-vllm--", "reason"]  # 2 GPUs: in budget
    assert table.loc["a100_tp2-x2-vllm--", "reason"] == "4 GPUs over the budget of 2"
    unpriced = table.loc["h200_tp2-x1-vllm--"]  # searched all the same, not ranked by cost
    assert "no price for GPU 'h200'" in unpriced["reason"] and "capacity searched" in unpriced["reason"]
    assert unpriced["capacity"] > 0 and math.isnan(unpriced["usd_per_hour"]) and not unpriced["pareto"]
    found = table.loc["a100_tp2-x1-vllm--"]
    assert found["status"] == "found" and found["capacity"] > 0 and found["gpus"] == 2
    assert found["usd_per_hour"] == pytest.approx(2 * 2.4984)
    assert found["qps_per_usd_hour"] == pytest.approx(found["capacity"] / found["usd_per_hour"])
    assert best(table.reset_index())["key"] == "a100_tp2-x1-vllm--"
    assert (out / "results.parquet").is_file() and (out / "pareto.png").is_file()
    assert pd.read_parquet(out / "results.parquet").shape[0] == 6

    def refuse(*args, **kwargs):
        raise AssertionError("a finished deployment was searched again")

    monkeypatch.setattr(grid_module, "deployment_capacity", refuse)
    again = run_grid(spec, out, read_prices(), log=lines.append).set_index("key")
    assert again.loc["a100_tp2-x1-vllm--", "capacity"] == found["capacity"]
    assert "6 found in" in lines[-1] or any("6 found in" in x for x in lines)


def test_the_pareto_frontier_keeps_the_deployments_nothing_beats_on_cost_and_latency():
    records = [{"key": k, "policy": "p", "capacity": 1.0, "usd_per_hour": 1.0, "qps_per_usd_hour": 1.0,
                "usd_per_million_requests": cost, "ttft_p90": ttft}
               for k, cost, ttft in (("a", 1, 3), ("b", 2, 2), ("c", 3, 1), ("d", 3, 3), ("e", 2, 2.5))]
    records.append({"key": "f", "policy": "p", "capacity": math.nan, "status": "skipped"})
    table = results_table(records).set_index("key")
    assert table["pareto"].to_dict() == {"a": True, "b": True, "c": True, "d": False, "e": False, "f": False}


@pytest.mark.parametrize("body, message", [
    ("overrides: []\ngrid: {hardware: [a100_tp2], replicas: [1], policies: {vllm: [{}]}}\nbudget: 4\n",
     "budget: not a search setting; allowed: overrides, criterion"),
    ("grid: {hardware: [b200_tp2], replicas: [1], policies: {vllm: [{}]}}\n",
     "grid.hardware='b200_tp2': unknown hardware; allowed: a100_tp1"),
    ("grid: {hardware: [a100_tp2], replicas: [0], policies: {vllm: [{}]}}\n",
     "grid.replicas has 0; allowed: whole numbers >= 1"),
    ("grid: {hardware: [a100_tp2], replicas: [1], policies: {vllm: {chunk_size: 2}}}\n",
     "grid.policies.vllm={'chunk_size': 2}: allowed: a list of settings"),
    ("grid: {hardware: [a100_tp2], replicas: [1], deployments: [p9d9], policies: {vllm: [{}]}}\n",
     "grid.deployments='p9d9': unknown deployment"),
    ("criterion: fast\ngrid: {hardware: [a100_tp2], replicas: [1], policies: {vllm: [{}]}}\n",
     "criterion='fast': unknown criterion"),
    ("search: {tolerance: 3}\ngrid: {hardware: [a100_tp2], replicas: [1], policies: {vllm: [{}]}}\n",
     "search.tolerance=3: allowed"),
    ("gpu_budget: 0\ngrid: {hardware: [a100_tp2], replicas: [1], policies: {vllm: [{}]}}\n",
     "gpu_budget=0: allowed: a whole number of GPUs >= 1"),
])
def test_a_bad_spec_is_one_line(tmp_path, body, message):
    path = tmp_path / "spec.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError) as err:
        read_spec(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_shipped_example_reads():
    spec = read_spec("llama2_70b_conv_small")
    assert len(spec.deployments) == 48  # 4 hardware x (3 replica counts + p1d3) x 3 policy settings
    ha = [d for d in spec.deployments if d.layout == "p1d3" and d.hardware == "a100_tp4"][0]
    assert sum(tp * pp for _, tp, pp in ha.replicas) == 16


def test_the_command_line_prints_the_best_deployment(tmp_path, capsys):
    from kvstudy.search.__main__ import main

    path = _spec(tmp_path, SPEC)
    assert main(["grid", str(path), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "best: a100_tp2-x1-vllm-- (2 GPUs, $5.00/h): capacity" in printed
    assert main(["grid", str(path), "--out", str(tmp_path / "out"), "--jobs", "0"]) == 2
    assert "--jobs=0: allowed: a whole number >= 1" in capsys.readouterr().err


def test_ctrl_c_keeps_the_finished_deployments_and_says_how_to_go_on(tmp_path, monkeypatch):
    spec = read_spec(_spec(tmp_path, SPEC.replace("hardware: [a100_tp1, a100_tp2, h200_tp2]",
                                                  "hardware: [a100_tp2, h100_tp2]").replace("gpu_budget: 2",
                                                                                             "gpu_budget: 8")))
    calls = []

    def fake(overrides, criterion, seeds, **search):
        calls.append(overrides)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return {"found": 1, "statuses": ["found"], "mean": 2.0, "min": 2.0, "max": 2.0, "std": 0.0,
                "searches": [{"capacity": 2.0, "failing": 2.2, "status": "found", "probes": []}]}

    monkeypatch.setattr(grid_module, "deployment_capacity", fake)
    lines = []
    with pytest.raises(KeyboardInterrupt):
        run_grid(spec, tmp_path / "out", read_prices(), log=lines.append)
    written = list((tmp_path / "out" / "deployments").glob("*.json"))
    assert len(written) == 1
    assert lines[-1].startswith("interrupted: 1 of 4 deployments written") and "run the same command again" in lines[-1]


def test_the_pipeline_axis_counts_its_gpus_and_keeps_the_pp1_keys(tmp_path):
    spec = read_spec(_spec(tmp_path, SPEC.replace("replicas: [1, 2]", "pipeline: [1, 2]\n  replicas: [1, 2]")))
    keys = {d.key: d for d in spec.deployments}
    assert "a100_tp2-x1-vllm--" in keys and "a100_tp2-x1-pp2-vllm--" in keys  # PP=1 as before: resume still finds it
    deep = keys["a100_tp2-x2-pp2-vllm--"]
    assert sum(tp * pp for _, tp, pp in deep.replicas) == 8
    assert "hardware.pipeline_parallel=2" in deep.overrides and "cluster.replicas=2" in deep.overrides
    with pytest.raises(ConfigError, match="grid.pipeline has 0; allowed: whole numbers >= 1"):
        read_spec(_spec(tmp_path, SPEC.replace("replicas: [1, 2]", "pipeline: [0]\n  replicas: [1]")))


def test_a_pipelined_deployment_is_searched(tmp_path):
    """PP=2 on the linear model: the run keeps batches in flight (kvstudy/engine/pipeline.py) and the grid searches
    it at twice the GPUs of PP=1 (with the KV of half the weights per GPU it meets the SLO up to the range's top)."""
    body = SPEC.replace("hardware: [a100_tp1, a100_tp2, h200_tp2]", "hardware: [a100_tp2]").replace(
        "replicas: [1, 2]", "pipeline: [2]\n  replicas: [1]").replace("gpu_budget: 2", "gpu_budget: 4")
    table = run_grid(read_spec(_spec(tmp_path, body)), tmp_path / "out", read_prices(), log=lambda *_: None)
    row = table.set_index("key").loc["a100_tp2-x1-pp2-vllm--"]
    assert row["status"] in ("found", "above_range") and row["gpus"] == 4 and row["capacity"] > 0


def _square(x):
    return x * x


def test_the_launchers_return_each_result_in_order(tmp_path):
    from kvstudy.search.fanout import fan_out

    assert list(fan_out(_square, [1, 2, 3])) == [1, 4, 9]
    assert list(fan_out(_square, [1, 2, 3], jobs=2)) == [1, 4, 9]
    # submitit's local executor: each a process of its own, as a SLURM array would run them
    assert list(fan_out(_square, [2, 3], "submitit_local", folder=tmp_path / "sub",
                        options={"timeout_min": 5})) == [4, 9]


def test_the_ray_launcher_submits_one_task_each_and_cancels_the_rest(monkeypatch):
    """Ray's API as the launcher uses it (init, remote, get, cancel), faked: Ray is not installed here."""
    import sys
    import types

    from kvstudy.search.fanout import fan_out

    calls = {"init": [], "cancel": [], "num_cpus": []}

    class Ref:
        def __init__(self, value):
            self.value = value

    def remote(num_cpus):
        calls["num_cpus"].append(num_cpus)
        return lambda fn: types.SimpleNamespace(remote=lambda a: Ref(fn(a)))

    fake = types.SimpleNamespace(is_initialized=lambda: False, init=lambda address: calls["init"].append(address),
                                 remote=remote, get=lambda ref: ref.value, cancel=lambda ref: calls["cancel"].append(
                                     ref.value))
    monkeypatch.setitem(sys.modules, "ray", fake)
    results = fan_out(_square, [1, 2, 3], "ray", options={"address": "auto", "num_cpus": 2})
    assert next(results) == 1
    results.close()  # Ctrl-C after the first: the two not taken are cancelled
    assert calls == {"init": ["auto"], "cancel": [4, 9], "num_cpus": [2]}


@pytest.mark.parametrize("launcher,options,message", [
    ("kubernetes", {}, "--launcher=kubernetes: allowed: local, submitit_local, slurm, ray"),
    ("local", {"slurm_partition": "cpu"}, "--launcher-option slurm_partition: the local launcher takes none"),
    ("ray", {"gpus": 1}, "--launcher-option gpus: the ray launcher takes address and num_cpus"),
])
def test_a_bad_launcher_is_one_line(launcher, options, message, monkeypatch):
    import sys
    import types

    from kvstudy.search.fanout import fan_out

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace())
    with pytest.raises(ConfigError) as err:
        fan_out(_square, [1], launcher, options=options)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_slurm_without_sbatch_says_so(monkeypatch):
    from kvstudy.search import fanout

    monkeypatch.setattr(fanout.shutil, "which", lambda name: None)
    with pytest.raises(ConfigError, match="no sbatch on the PATH"):
        fanout.fan_out(_square, [1], "slurm")


def test_the_slo_at_capacity_ranks_only_the_deployments_that_meet_it():
    """Vidur-Search's rule: capacity by the criterion, then the latencies at that capacity within the SLO."""
    records = [
        {"key": "fast-but-late", "capacity": 10.0, "usd_per_hour": 1.0, "qps_per_usd_hour": 10.0,
         "usd_per_million_requests": 27.8, "ttft_p90": 9.0, "tbt_p99": 0.1, "status": "found"},
        {"key": "slower-in-time", "capacity": 4.0, "usd_per_hour": 1.0, "qps_per_usd_hour": 4.0,
         "usd_per_million_requests": 69.4, "ttft_p90": 1.5, "tbt_p99": 0.1, "status": "found"},
        {"key": "skipped", "status": "skipped", "reason": "8 GPUs over the budget of 4"},
    ]
    assert best(results_table(records))["key"] == "fast-but-late"
    table = results_table(records, {"ttft_p90": 2.0, "tbt_p99": 0.2})
    assert table.set_index("key")["meets_slo"].to_dict() == {"slower-in-time": True, "fast-but-late": False,
                                                             "skipped": False}
    assert best(table)["key"] == "slower-in-time"
    assert best(results_table(records, {"ttft_p90": 1.0})) is None


@pytest.mark.parametrize("slo,message", [
    ("{ttft_p99: 2}", "slo.ttft_p99: not a latency at capacity; allowed: ttft_p90, tbt_p99, e2e_median"),
    ("{ttft_p90: 0}", "slo.ttft_p90=0: allowed: seconds > 0"),
    ("[2, 0.2]", "slo=[2, 0.2]: allowed: a mapping"),
])
def test_a_bad_slo_is_one_line(tmp_path, slo, message):
    path = tmp_path / "spec.yaml"
    path.write_text(f"slo: {slo}\ngrid: {{hardware: [a100_tp2], replicas: [1], policies: {{vllm: [{{}}]}}}}\n")
    with pytest.raises(ConfigError) as err:
        read_spec(path)
    assert message in str(err.value) and "\n" not in str(err.value)
