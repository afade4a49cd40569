"""Workloads: LMSYS stand-in statistics, the real-parquet loader, traces and timestamps."""
import json

import numpy as np
import pandas as pd
import pytest

from kvstudy import api
from kvstudy.errors import DataError
from kvstudy.workloads.lmsys import lmsys, real_lengths
from kvstudy.workloads.trace import trace
from tests.conftest import needs_shared
from kvstudy.running.paths import SHARED_REFERENCE


def test_lmsys_standin_matches_published_statistics():
    df = lmsys(50_000, np.random.default_rng(0), max_model_len=4096)
    # paper: prompt mean 40.62 / median 11, output mean 85.32 / median 45 (words)
    assert df["prompt_tokens"].median() == pytest.approx(11, abs=1)
    assert df["output_tokens"].median() == pytest.approx(45, abs=2)
    assert df["prompt_tokens"].mean() == pytest.approx(40.62, rel=0.12)
    assert df["output_tokens"].mean() == pytest.approx(85.32, rel=0.06)
    assert (df.prompt_tokens + df.output_tokens <= 4096).all()


def test_real_lmsys_parquet_loader(tmp_path):
    rows = [{"conversation": [{"role": "user", "content": "hello there friend"},
                              {"role": "assistant", "content": "one two three four five"}]},
            {"conversation": [{"role": "user", "content": "a b"}, {"role": "assistant", "content": "x"}]},
            {"conversation": [{"role": "user", "content": "only a question"}]}]
    pd.DataFrame(rows).to_parquet(tmp_path / "train-00000.parquet")
    df = real_lengths(str(tmp_path / "*.parquet"), 2, np.random.default_rng(0))
    assert sorted(zip(df.prompt_tokens, df.output_tokens)) == [(2, 1), (3, 5)]
    with pytest.raises(DataError, match="fewer than workload.num_requests=3"):
        real_lengths(str(tmp_path / "*.parquet"), 3, np.random.default_rng(0))


def test_trace_formats_and_column_mapping(tmp_path):
    df = pd.DataFrame({"In": [10, 20, 30], "Out": [5, 6, 7], "ts": ["2024-01-01T00:00:00", "2024-01-01T00:00:01.5",
                                                                   "2024-01-01T00:00:03"]})
    df.to_csv(tmp_path / "t.csv", index=False)
    out = trace(str(tmp_path / "t.csv"), columns={"prompt_tokens": "In", "output_tokens": "Out", "arrival_time": "ts"})
    assert out["arrival_time"].tolist() == [0.0, 1.5, 3.0]
    with open(tmp_path / "t.jsonl", "w") as fh:
        for i in range(3):
            fh.write(json.dumps({"prompt_tokens": 5 + i, "output_tokens": 3, "arrival_time": 1000 * i}) + "\n")
    out = trace(str(tmp_path / "t.jsonl"), time_unit="ms")
    assert out["arrival_time"].tolist() == [0.0, 1.0, 2.0]
    df.rename(columns={"In": "num_prefill_tokens", "Out": "num_decode_tokens"}).drop(columns="ts").to_parquet(
        tmp_path / "t.parquet")
    assert trace(str(tmp_path / "t.parquet"))["prompt_tokens"].tolist() == [10, 20, 30]


@needs_shared
@pytest.mark.parametrize("name,columns", [
    ("vidur-data/traces/splitwise_conv.csv", {}),
    ("vidur-data/traces/splitwise_code.csv", {}),
    ("traces-extra/sharegpt_8k_filtered_stats_llama2_tokenizer.csv", {}),
])
def test_shared_traces_run(name, columns, tmp_path):
    path = SHARED_REFERENCE / name
    head = pd.read_csv(path, nrows=0).columns.tolist()
    overrides = ["+policy=mcsf", "workload=trace", f"workload.path={path}", "workload.num_requests=200",
                 "workload.drop_over_context=true", "latency=linear", "engine.progress=false"]
    if "arrived_at" not in head and "arrival_time" not in head:
        overrides.append("+demand=low")
    summary = api.run(api.compose(overrides), tmp_path)
    assert summary["completed"] + summary["rejected"] == 200


@needs_shared
def test_alpaca_words_as_a_trace(tmp_path):
    records = json.loads((SHARED_REFERENCE / "traces-extra/alpaca_5000.json").read_text())[:300]
    df = pd.DataFrame({"p": [len((r["instruction"] + " " + r["input"]).split()) for r in records],
                       "o": [max(1, len(r["output"].split())) for r in records]})
    df.to_parquet(tmp_path / "alpaca.parquet")
    cfg = api.compose(["+policy=mc_benchmark", "+demand=high", "workload=trace", f"workload.path={tmp_path}/alpaca.parquet",
                       "workload.columns.prompt_tokens=p", "workload.columns.output_tokens=o", "latency=unit",
                       "engine.progress=false"])
    assert api.run(cfg, tmp_path / "run")["completed"] == 300


def test_same_seed_identical_requests(tmp_path):
    base = ["+policy=mcsf", "+demand=high", "latency=linear", "workload.num_requests=100", "engine.progress=false"]
    for name in ("a", "b"):
        api.run(api.compose(base + ["seed=7"]), tmp_path / name)
    api.run(api.compose(base + ["seed=8"]), tmp_path / "c")
    a, b, c = (pd.read_parquet(tmp_path / n / "requests.parquet") for n in "abc")
    assert a.equals(b)
    assert not a.equals(c)


def _requests(overrides):
    from kvstudy.costs.arch import ModelArch

    cfg = api.compose(["+policy=mcsf", "+demand=high", "workload.num_requests=50"] + overrides)
    arch = ModelArch.from_mapping(api._plain(cfg.model))
    req, _ = api.build_requests(cfg, arch, np.random.SeedSequence(int(cfg.seed)))
    return req


def test_length_seed_fixes_the_request_set_and_seed_redraws_arrivals():
    base0, base5 = _requests(["seed=0"]), _requests(["seed=5"])
    fixed = _requests(["seed=5", "workload.length_seed=0"])
    # with length_seed unset a run is what it was (lengths follow seed)
    assert not np.array_equal(base0.output_tokens, base5.output_tokens)
    # length_seed=0: the lengths of seed 0, the arrivals of seed 5 (requests are in arrival order)
    assert sorted(zip(fixed.prompt_tokens, fixed.output_tokens)) == sorted(zip(base0.prompt_tokens, base0.output_tokens))
    assert np.array_equal(fixed.arrival_time, base5.arrival_time)
    with pytest.raises(api.ConfigError, match="workload.length_seed=-1"):
        _requests(["workload.length_seed=-1"])


def _trace_file(tmp_path, n=20):
    path = tmp_path / "t.csv"
    pd.DataFrame({"arrival_time": np.arange(n) * 2.0, "prompt_tokens": np.arange(1, n + 1),
                  "output_tokens": np.arange(101, 101 + n)}).to_csv(path, index=False)
    return str(path)


def test_trace_sampling_is_seeded_and_keeps_time_order(tmp_path):
    path = _trace_file(tmp_path)
    a = trace(path, num_requests=8, sample="without_replacement", rng=np.random.default_rng(1))
    b = trace(path, num_requests=8, sample="without_replacement", rng=np.random.default_rng(1))
    c = trace(path, num_requests=8, sample="without_replacement", rng=np.random.default_rng(2))
    assert a.equals(b) and not a.equals(c)
    assert a.prompt_tokens.is_unique and a.arrival_time.is_monotonic_increasing
    d = trace(path, num_requests=60, sample="with_replacement", rng=np.random.default_rng(1))
    assert len(d) == 60 and not d.prompt_tokens.is_unique  # more than the trace holds: rows repeat
    assert trace(path, num_requests=5).prompt_tokens.tolist() == [1, 2, 3, 4, 5]  # no sample: the first rows
    # through the config: the run's seed draws the sample, length_seed fixes it across seeds
    run = lambda *o: _requests(["workload=trace", f"workload.path={path}", "~demand", "workload.num_requests=8",
                                "workload.sample=without_replacement", *o]).prompt_tokens.tolist()
    assert run("seed=0") != run("seed=1") and run("seed=1", "workload.length_seed=0") == run("seed=0")


def test_trace_rate_scale_and_bad_sampling(tmp_path):
    path = _trace_file(tmp_path)
    assert trace(path, rate_scale=2).arrival_time.tolist()[:3] == [0.0, 1.0, 2.0]
    with pytest.raises(DataError, match="workload.rate_scale=0"):
        trace(path, rate_scale=0)
    with pytest.raises(DataError, match="workload.sample='sometimes'"):
        trace(path, num_requests=3, sample="sometimes")
    with pytest.raises(DataError, match="set workload.num_requests"):
        trace(path, sample="with_replacement")
    with pytest.raises(DataError, match="only 20 rows to draw without replacement"):
        trace(path, num_requests=21, sample="without_replacement")
