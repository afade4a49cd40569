"""Issue 46: trace data that used to be accepted silently (or end in a traceback) is refused in one line naming the
file, the column, the row, the bad value and what is allowed; valid traces read as before."""
import json

import numpy as np
import pandas as pd
import pytest

from kvstudy import api
from kvstudy.errors import ConfigError, DataError, KvStudyError
from kvstudy.latency.tables import MIN_PREFILL_CHUNK, PredictorSettings
from kvstudy.workloads.trace import mooncake_segments
from kvstudy.workloads.requests import MAX_TIME_S, make_requests
from kvstudy.workloads.trace import trace

# Mooncake's first rows: hash ids of 512-token blocks, ceil(prompt / 512) of them
PROMPTS = [6758, 7322, 7236, 2290, 1000, 3000]


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def mooncake_rows(block=512):
    rows, next_id = [], 0
    for t, prompt in enumerate(PROMPTS):
        n = -(-prompt // block)
        rows.append({"timestamp": 1000 * t, "input_length": prompt, "output_length": 10,
                     "hash_ids": list(range(next_id, next_id + n))})
        next_id += n
    return rows


# --- 1. booleans ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("field", ["prompt_tokens", "output_tokens", "predicted_output_tokens", "request_id"])
def test_a_boolean_among_numbers_in_jsonl_is_refused(tmp_path, field):
    rows = [{"prompt_tokens": 10, "output_tokens": 5, "predicted_output_tokens": 4, "request_id": i,
             "arrival_time": float(i)} for i in range(3)]
    rows[1][field] = True  # pandas alone would read it as 1
    with pytest.raises(DataError, match=rf"t.jsonl: column '{field}' row 1 has value True, a boolean; allowed: "
                                        r"whole numbers >= [01]"):
        trace(jsonl(tmp_path / "t.jsonl", rows))


def test_an_all_boolean_column_is_refused_in_every_format(tmp_path):
    frame = pd.DataFrame({"prompt_tokens": [10, 20], "output_tokens": [True, False], "arrival_time": [0.0, 1.0]})
    frame.to_parquet(tmp_path / "t.parquet")
    with pytest.raises(DataError, match=r"t.parquet: column 'output_tokens' row 0 has value True, a boolean"):
        trace(str(tmp_path / "t.parquet"))
    frame.to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(DataError, match=r"t.csv: column 'output_tokens' row 0 has value True, a boolean"):
        trace(str(tmp_path / "t.csv"))
    rows = [{"input_length": 10, "output_length": 5, "timestamp": 0}, {"input_length": False, "output_length": 5,
                                                                        "timestamp": 1}]
    with pytest.raises(DataError, match=r"column 'input_length' \(prompt_tokens\) row 1 has value False, a boolean"):
        trace(jsonl(tmp_path / "m.jsonl", rows))


def test_boolean_times_ids_and_segments_are_refused(tmp_path):
    rows = [{"prompt_tokens": 10, "output_tokens": 5, "arrival_time": 0}, {"prompt_tokens": 10, "output_tokens": 5,
                                                                           "arrival_time": True}]
    with pytest.raises(DataError, match=r"column 'arrival_time' row 1 has value True, a boolean; allowed: numbers"):
        trace(jsonl(tmp_path / "a.jsonl", rows))
    frame = pd.DataFrame({"prompt_tokens": [10, 20], "output_tokens": [3, 3], "arrival_time": [True, False]})
    frame.to_parquet(tmp_path / "a.parquet")
    with pytest.raises(DataError, match=r"column 'arrival_time' row 0 has value True, a boolean"):
        trace(str(tmp_path / "a.parquet"))
    rows = [{"prompt_tokens": 40, "output_tokens": 5, "hash_ids": [1, True]}]
    with pytest.raises(DataError, match=r"column 'hash_ids' row 0 has '\[1, True\]' \(booleans\); allowed: a list of "
                                        r"whole numbers"):
        trace(jsonl(tmp_path / "h.jsonl", rows), hash_block_size=16)
    rows = [{"prompt_tokens": 40, "output_tokens": 5, "segments": [[7, 16], [True, 16]]}]
    with pytest.raises(DataError, match=r"column 'segments' row 0"):
        trace(jsonl(tmp_path / "s.jsonl", rows))
    with pytest.raises(DataError, match=r"column 'arrival_time' row 1 has value True, a boolean; allowed: finite times"):
        make_requests(np.array([0.0, True], dtype=object), [1, 2], [3, 4], source="x")


# --- 2. timestamps too large for float64 to keep microseconds -------------------------------------------------------

def test_huge_timestamps_are_refused_with_the_bound(tmp_path):
    rows = [{"prompt_tokens": 10, "output_tokens": 5, "arrival_time": 1e17 + i} for i in range(3)]
    with pytest.raises(DataError, match=r"t.jsonl: column 'arrival_time' row 0 has value .*allowed: times < "
                                        r"2\*\*33 = 8,589,934,592 s.*subtract a start time"):
        trace(jsonl(tmp_path / "t.jsonl", rows))
    # epoch milliseconds read as seconds: refused with the unit to set; as milliseconds they read (shifted to 0)
    pd.DataFrame({"prompt_tokens": [1, 2], "output_tokens": [3, 3], "arrival_time": [1_700_000_000_000,
                                                                                    1_700_000_001_500]}).to_csv(
        tmp_path / "ms.csv", index=False)
    with pytest.raises(DataError, match=r"row 0 has value 1700000000000 .*set workload.time_unit=ms"):
        trace(str(tmp_path / "ms.csv"))
    assert trace(str(tmp_path / "ms.csv"), time_unit="ms").arrival_time.tolist() == pytest.approx([0.0, 1.5], abs=1e-6)
    # just below the bound still reads (and keeps a millisecond step)
    below = MAX_TIME_S - 1.0
    pd.DataFrame({"prompt_tokens": [1, 2], "output_tokens": [3, 3], "arrival_time": [below - 0.001, below]}).to_csv(
        tmp_path / "ok.csv", index=False)
    assert trace(str(tmp_path / "ok.csv")).arrival_time.tolist() == pytest.approx([0.0, 0.001], abs=2e-6)
    with pytest.raises(DataError, match=r"column 'arrival_time' row 1 has value 1e\+17; allowed: finite times >= 0 "
                                        r"and < 2\*\*33"):
        make_requests([0.0, 1e17], [1, 2], [3, 4], source="x")


def test_json_numbers_in_a_date_named_column_are_not_guessed_into_datetimes(tmp_path):
    # pandas would read 1e17 in 'arrival_time' as nanoseconds since 1970 (a datetime) and the run would go on
    rows = [{"prompt_tokens": 10, "output_tokens": 5, "arrival_time": 10 ** 17 + 10 ** 9 * i} for i in range(3)]
    with pytest.raises(DataError, match=r"2\*\*33"):
        trace(jsonl(tmp_path / "t.jsonl", rows))
    iso = [{"prompt_tokens": 10, "output_tokens": 5, "arrival_time": f"2024-01-01T00:00:0{i}"} for i in range(3)]
    assert trace(jsonl(tmp_path / "iso.jsonl", iso)).arrival_time.tolist() == [0.0, 1.0, 2.0]


# --- 3. column settings reading one column --------------------------------------------------------------------------

def test_two_settings_or_a_setting_and_a_fields_own_name_on_one_column(tmp_path):
    path = tmp_path / "t.csv"
    pd.DataFrame({"prompt_tokens": [10, 20], "output_tokens": [3, 4], "x": [5, 6]}).to_csv(path, index=False)
    with pytest.raises(ConfigError, match=r"workload.columns.prompt_tokens='x' and workload.columns.output_tokens='x' "
                                          r"both read column 'x' of .*t.csv; allowed: each column read by one field"):
        trace(str(path), columns={"prompt_tokens": "x", "output_tokens": "x"})
    with pytest.raises(ConfigError, match=r"t.csv: column 'output_tokens' would be read as both prompt_tokens "
                                          r"\(workload.columns.prompt_tokens='output_tokens'\) and output_tokens"):
        trace(str(path), columns={"prompt_tokens": "output_tokens"})
    with pytest.raises(ConfigError, match=r"column 'prompt_tokens' would be read as both predicted_output_tokens"):
        trace(str(path), columns={"predicted_output_tokens": "prompt_tokens"})
    # a swap reads each column once: allowed
    out = trace(str(path), columns={"prompt_tokens": "output_tokens", "output_tokens": "prompt_tokens"})
    assert out.prompt_tokens.tolist() == [3, 4] and out.output_tokens.tolist() == [10, 20]
    # a setting naming no column of the file, or a field a trace has not, is named too
    with pytest.raises(DataError, match=r"workload.columns.arrival_time='ts' names no column of the file"):
        trace(str(path), columns={"arrival_time": "ts"})
    with pytest.raises(ConfigError, match=r"workload.columns.promt_tokens: not a field"):
        trace(str(path), columns={"promt_tokens": "x"})


def test_two_names_of_one_field_in_a_file(tmp_path):
    path = tmp_path / "t.csv"
    pd.DataFrame({"prompt_tokens": [10, 20], "input_length": [1, 2], "output_tokens": [3, 4]}).to_csv(path,
                                                                                                  index=False)
    with pytest.raises(DataError, match=r"columns 'prompt_tokens' and 'input_length' are both names of prompt_tokens"):
        trace(str(path))
    assert trace(str(path), columns={"prompt_tokens": "input_length"}).prompt_tokens.tolist() == [1, 2]


def test_a_setting_through_the_config_is_refused_in_one_line(tmp_path):
    path = tmp_path / "t.csv"
    pd.DataFrame({"prompt_tokens": [10, 20], "output_tokens": [3, 4], "arrival_time": [0, 1]}).to_csv(path,
                                                                                                  index=False)
    with pytest.raises(ConfigError, match=r"column 'output_tokens' would be read as both prompt_tokens"):
        api.simulate(api.compose(["+policy=mcsf", "workload=trace", f"workload.path={path}",
                                  "workload.columns.prompt_tokens=output_tokens", "latency=linear",
                                  "engine.progress=false"]))


# --- 4. a column name given twice -----------------------------------------------------------------------------------

def test_repeated_column_names_are_refused(tmp_path):
    (tmp_path / "t.csv").write_text("prompt_tokens,output_tokens,prompt_tokens\n10,3,20\n11,3,21\n")
    with pytest.raises(DataError, match=r"t.csv: column 'prompt_tokens' appears 2 times in the header \(positions "
                                        r"\[0, 2\]\); allowed: each column name once"):
        trace(str(tmp_path / "t.csv"))
    (tmp_path / "t.jsonl").write_text('{"prompt_tokens": 10, "output_tokens": 3}\n'
                                      '{"prompt_tokens": 10, "output_tokens": 3, "output_tokens": 9}\n')
    with pytest.raises(DataError, match=r"t.jsonl: line 2 has key 'output_tokens' twice in one record"):
        trace(str(tmp_path / "t.jsonl"))
    # a column really named like pandas' renaming is no repeat
    (tmp_path / "ok.csv").write_text("prompt_tokens,output_tokens,prompt_tokens.1\n10,3,20\n")
    assert trace(str(tmp_path / "ok.csv")).prompt_tokens.tolist() == [10]
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_arrays([pa.array([10, 11]), pa.array([3, 3]), pa.array([20, 21])],
                                 names=["prompt_tokens", "output_tokens", "prompt_tokens"])
    try:
        pq.write_table(table, tmp_path / "t.parquet")
    except Exception:  # an Arrow that cannot write such a file: nobody can hand kvstudy one either
        return
    with pytest.raises(DataError, match=r"t.parquet: .*prompt_tokens"):
        trace(str(tmp_path / "t.parquet"))


# --- 5. two sources of shared prefixes ------------------------------------------------------------------------------

def test_hash_ids_and_segments_in_one_file_are_refused(tmp_path):
    rows = [{"prompt_tokens": 40, "output_tokens": 5, "hash_ids": [1, 2, 3], "segments": [[1, 16]]}]
    with pytest.raises(DataError, match=r"columns 'hash_ids' .* and 'segments' .* both describe shared prefixes .*"
                                        r"keep 'hash_ids' .* or 'segments' and remove the other column"):
        trace(jsonl(tmp_path / "t.jsonl", rows), hash_block_size=16)


def test_segments_are_read_from_csv_cells_and_checked_at_the_files_row(tmp_path):
    frame = pd.DataFrame({"prompt_tokens": [40, 20], "output_tokens": [5, 5],
                          "segments": [json.dumps([[1, 16], [2, 24]]), json.dumps([[1, 16]])]})
    frame.to_csv(tmp_path / "t.csv", index=False)
    out = trace(str(tmp_path / "t.csv"))
    assert out.segments.tolist() == [[[1, 16], [2, 24]], [[1, 16]]]
    frame.loc[1, "segments"] = json.dumps([[1, 0]])
    frame.to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(DataError, match=r"column 'segments' row 1"):
        trace(str(tmp_path / "t.csv"))


# --- 6. hash ids of another block size ------------------------------------------------------------------------------

def test_hash_block_size_other_than_the_traces_is_refused_with_the_counts(tmp_path):
    path = jsonl(tmp_path / "m.jsonl", mooncake_rows())
    out = trace(path, time_unit="ms")  # 512, as Mooncake's: read
    assert out.segments.tolist()[3] == mooncake_segments(list(range(44, 49)), 2290, 512)
    with pytest.raises(DataError, match=r"m.jsonl: column 'hash_ids': 6 of 6 rows with ids have fewer than their "
                                        r"prompts' full blocks of workload.hash_block_size=256 \(row 0: 14 ids for a "
                                        r"prompt of 6758 tokens, 26 full blocks\), and every row's count fits "
                                        r"workload.hash_block_size=500..516 \(Mooncake's 512\)"):
        trace(path, time_unit="ms", hash_block_size=256)
    with pytest.raises(DataError, match=r"column 'hash_ids' row 0 has 14 ids for a prompt of 6758 tokens \(at most 7 "
                                        r"blocks of workload.hash_block_size=1024\); 6 of 6 rows have more ids than "
                                        r"ceil\(prompt / 1024\); the counts fit workload.hash_block_size=500..516"):
        trace(path, time_unit="ms", hash_block_size=1024)
    # through a run: the same line
    with pytest.raises(DataError, match=r"6 of 6 rows with ids have fewer"):
        api.simulate(api.compose(["+policy=mcsf", "workload=trace", f"workload.path={path}", "workload.time_unit=ms",
                                  "workload.hash_block_size=16", "model=llama31_8b", "hardware=a100_tp1",
                                  "latency=linear", "engine.progress=false"]))


def test_ids_for_a_prefix_only_or_full_blocks_only_still_read(tmp_path):
    # ids for a shared prefix only (the rest of each prompt its own), or for full blocks only: nothing refused
    prefix_only = [{"prompt_tokens": p, "output_tokens": 3, "hash_ids": [1]} for p in (400, 900, 1500)]
    assert len(trace(jsonl(tmp_path / "a.jsonl", prefix_only), hash_block_size=16)) == 3
    mixed = [{"prompt_tokens": 400, "output_tokens": 3, "hash_ids": [1]},
             {"prompt_tokens": 40, "output_tokens": 3, "hash_ids": [2]}]
    assert len(trace(jsonl(tmp_path / "b.jsonl", mixed), hash_block_size=16)) == 2
    rng = np.random.default_rng(0)
    full = []
    for _ in range(50):
        n = int(rng.integers(1, 12))
        full.append({"prompt_tokens": 16 * n + int(rng.integers(0, 16)), "output_tokens": 3,
                     "hash_ids": list(range(n))})
    assert len(trace(jsonl(tmp_path / "c.jsonl", full), hash_block_size=16)) == 50


# --- the remaining ranges, at the file's row ------------------------------------------------------------------------

def test_a_bad_prediction_is_named_at_the_files_row_after_a_drop(tmp_path):
    pd.DataFrame({"prompt_tokens": [5000, 10, 20], "output_tokens": [3, 3, 3], "predicted_output_tokens": [1, 1, 0.5],
                  "arrival_time": [0, 1, 2]}).to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(DataError, match=r"column 'predicted_output_tokens' row 2 has value 0.5; allowed: whole "
                                        r"numbers >= 1"):
        trace(str(tmp_path / "t.csv"), max_model_len=4096, over_context="drop")


# --- 7. a context too short for Vidur's predictor -------------------------------------------------------------------

def test_a_context_too_short_to_train_vidur_is_named_before_training(tmp_path):
    assert PredictorSettings(max_prefill_chunk=MIN_PREFILL_CHUNK).max_prefill_chunk == 32
    with pytest.raises(ConfigError, match=r"model.max_model_len .* at most 8 tokens, too short to train Vidur's "
                                          r"latency predictor .*allowed: model.max_model_len >= 32"):
        PredictorSettings(max_prefill_chunk=8)
    path = tmp_path / "t.csv"
    pd.DataFrame({"prompt_tokens": [2, 3], "output_tokens": [2, 2], "arrival_time": [0, 1]}).to_csv(path, index=False)
    with pytest.raises(ConfigError, match=r"^model.max_model_len .*allowed: model.max_model_len >= 32"):
        api.simulate(api.compose(["+policy=mcsf", "workload=trace", f"workload.path={path}", "model.max_model_len=8",
                                  "latency=vidur", "engine.progress=false"]))


def test_every_refusal_is_one_line(tmp_path):
    rows = [{"prompt_tokens": True, "output_tokens": 5}]
    with pytest.raises(KvStudyError) as info:
        trace(jsonl(tmp_path / "t.jsonl", rows))
    assert "\n" not in str(info.value)
