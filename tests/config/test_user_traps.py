"""Issue 27's list of traps, tried as a new user would: each ends in one clear line (or a documented, counted
choice), never a traceback, a hang, or silently changed data."""
import json
import signal
import subprocess
import sys
import time
import warnings

import pandas as pd
import pytest

from kvstudy import api
from kvstudy.errors import ConfigError, DataError
from kvstudy.running.paths import REPO_ROOT

FAST = ["latency=unit", "engine.progress=false", "workload.num_requests=20"]


def simulate(overrides):
    return api.simulate(api.compose(overrides))


def cli(*args, module="kvstudy", timeout=300):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("override,match", [
    ("workload.num_requests=abc", r"workload.num_requests='abc': allowed a number \(a whole number\)"),
    ("seed=abc", r"seed='abc': allowed a number"),
    ("demand.rate=abc", r"demand.rate='abc': allowed a number"),
    ("policy.alpha=abc", r"policy.alpha='abc': allowed a number"),
    ("seed=-1", r"seed=-1: allowed a whole number >= 0"),
    ("seed=1.5", r"seed=1.5: allowed a whole number"),
    ("engine.stall_limit=0", r"engine.stall_limit=0: allowed a whole number >= 1"),
    ("engine.stall_limit=-1", r"engine.stall_limit=-1: allowed a whole number >= 1"),
    ("engine.progress=maybe", r"engine.progress='maybe': allowed true or false"),
    ("workload.max_total_tokens=1", r"workload.max_total_tokens=1: allowed a whole number >= 2"),
    ("workload.max_total_tokens=-3", r"workload.max_total_tokens=-3: allowed a whole number >= 2"),
    ("memory.capacity_tokens=1e12", r"memory.capacity_tokens=1000000000000.0: allowed at most 67,108,864 tokens"),
])
def test_bad_values_name_the_key(override, match):
    policy = "+policy=alpha_greedy" if override.startswith("policy.") else "+policy=mcsf"
    with pytest.raises(ConfigError, match=match):
        simulate([policy, "+demand=high", *FAST, override])


def test_noise_level_must_be_a_number():
    with pytest.raises(ConfigError, match=r"predictor.epsilon='abc': allowed a number"):
        simulate(["+policy=mcsf", "+demand=high", "predictor=uniform_noise", "predictor.epsilon=abc", *FAST])


def test_a_tiny_length_limit_ends_in_a_message_not_a_hang():
    with pytest.raises(DataError, match="workload.max_total_tokens=3: fewer than 1 in 1,000"):
        simulate(["+policy=mcsf", "+demand=high", *FAST, "workload.max_total_tokens=3"])


@pytest.mark.parametrize("args,expected", [
    (["policy=mcsf", "+demand=high"], "error: policy is chosen with a +: write +policy=mcsf"),
    (["+policy=mcsf", "+demand=high", "policy.bogus=1"], "error: unknown key policy.bogus; keys of policy:"),
    (["+policy=mcsf", "+demand=high", "memory.capacity=100"], "error: unknown key memory.capacity; keys of memory:"),
])
def test_command_line_mistakes_are_one_line(args, expected, tmp_path):
    proc = cli(*args, f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(expected) and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_bad_value_fails_its_own_run_and_the_sweep_finishes(tmp_path):
    proc = cli("-m", "+policy=mcsf", "+demand=high", *FAST, "memory.capacity_tokens=16492,-1,8000",
               "hydra.launcher.n_jobs=1", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    finished = sorted(p.parent.name.split("memory.capacity_tokens=")[1].split(",")[0]
                      for p in tmp_path.rglob("summary.json"))
    failed = [p.parent.name for p in tmp_path.rglob("error.txt")]
    assert finished == ["16492", "8000"]
    assert len(failed) == 1 and "memory.capacity_tokens=-1" in failed[0]
    assert "1 run(s) of the sweep" in proc.stderr and "allowed a positive whole number" in proc.stderr


@pytest.mark.parametrize("args,expected", [
    (["adversary", "--M", "-5"], "error: --M -5: allowed whole numbers >= 4"),
    (["study", "--model", "1", "--trials", "1", "--lns-window", "0"], "error: --lns-window 0: allowed 1 or more"),
    (["study", "--model", "1", "--trials", "1", "--time-limit", "-1"], "error: --time-limit -1.0: allowed 0 or more"),
    (["study", "--model", "1", "--trials", "1", "--lns", "-1"], "error: --lns -1: allowed 0 or more"),
    (["bound", "+policy=nope"], "error: unknown policy 'nope'; allowed:"),
])
def test_optimum_command_mistakes_are_one_line(args, expected):
    proc = cli(*args, module="kvstudy.optimum")
    assert proc.returncode == 2 and proc.stderr.strip().startswith(expected), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_optimum_study_never_overwrites_and_refuses_a_folder(tmp_path):
    proc = cli("study", "--model", "1", "--trials", "1", "--time-limit", "0", "--out", str(tmp_path),
               module="kvstudy.optimum")
    assert proc.returncode == 2 and "a directory; allowed a .parquet file path" in proc.stderr
    out = tmp_path / "s.parquet"
    out.write_bytes(b"not touched")
    proc = cli("study", "--model", "1", "--trials", "1", "--time-limit", "0", "--out", str(out),
               module="kvstudy.optimum")
    assert proc.returncode == 2 and "exists; add --resume" in proc.stderr
    assert out.read_bytes() == b"not touched"


def trace(tmp_path, frame, name="t.csv"):
    path = tmp_path / name
    frame = pd.DataFrame(frame)
    frame.to_parquet(path) if name.endswith(".parquet") else frame.to_csv(path, index=False)
    return ["+policy=mcsf", "workload=trace", f"workload.path={path}", "latency=unit", "engine.progress=false"]


def test_empty_traces_are_refused(tmp_path):
    (tmp_path / "h.csv").write_text("arrival_time,prompt_tokens,output_tokens\n")
    with pytest.raises(DataError, match="no requests"):
        simulate(["+policy=mcsf", "workload=trace", f"workload.path={tmp_path / 'h.csv'}", "latency=unit"])
    over = trace(tmp_path, {"prompt_tokens": pd.Series([], dtype=int), "output_tokens": pd.Series([], dtype=int)},
                 "e.parquet")
    with pytest.raises(DataError, match="no requests"):
        simulate(over)


def test_duplicate_ids_and_negative_times_are_refused(tmp_path):
    with pytest.raises(DataError, match="column 'request_id' repeats id 7"):
        simulate(trace(tmp_path, {"request_id": [7, 7, 8], "prompt_tokens": [1, 2, 3], "output_tokens": [3, 3, 3],
                                  "arrival_time": [0, 1, 2]}))
    with pytest.raises(DataError, match=r"arrival_time row 1 is negative"):
        simulate(trace(tmp_path, {"prompt_tokens": [1, 2], "output_tokens": [3, 3], "arrival_time": [0, -2]}))


def test_trace_num_requests_must_be_positive(tmp_path):
    base = trace(tmp_path, {"prompt_tokens": [1, 2], "output_tokens": [3, 3], "arrival_time": [0, 1]})
    for n in (0, -5):
        with pytest.raises(ConfigError, match=f"workload.num_requests={n}: allowed a whole number >= 1"):
            simulate(base + [f"workload.num_requests={n}"])


def test_millisecond_timestamps_read_as_seconds_are_flagged(tmp_path):
    base = trace(tmp_path, {"prompt_tokens": [1, 2], "output_tokens": [3, 3], "arrival_time": [0, 2_000_000_000]})
    with pytest.warns(UserWarning, match=r"spans 23148.1 days read as seconds; .* workload.time_unit=ms"):
        simulate(base + ["latency=unit"])


def test_over_context_keep_drop_truncate_and_row_ids(tmp_path):
    # llama2_70b's context is 4096: rows 1 and 3 exceed it with their outputs; row 0 is dropped for its prompt
    frame = {"prompt_tokens": [5000, 4000, 10, 3000], "output_tokens": [5, 200, 5, 2000], "arrival_time": [0, 1, 2, 3]}
    base = trace(tmp_path, frame) + ["workload.drop_over_context=true"]
    with pytest.warns(UserWarning, match="2 of 3 requests whose prompt \\+ output exceeds the model context 4096: "
                                         "simulated as given"):
        res, _ = simulate(base)
    assert res.requests["request_id"].tolist() == [1, 2, 3]  # the file's rows, after the drop
    with pytest.warns(UserWarning, match="dropped 2 of 3 requests"):
        res, _ = simulate(base + ["workload.over_context=drop"])
    assert res.requests["request_id"].tolist() == [2]
    with pytest.warns(UserWarning, match="output capped at context - prompt for 2 of 3"):
        res, _ = simulate(base + ["workload.over_context=truncate"])
    assert res.requests["output_tokens"].tolist() == [96, 5, 1096]


def test_model_that_cannot_fit_runs_with_a_note():
    with pytest.warns(UserWarning, match="model 'llama2_70b' on hardware 'a100_vidur_default' needs .* timing model"):
        simulate(["+policy=mcsf", "+demand=high", "hardware=a100_vidur_default", *FAST])
    with warnings.catch_warnings(record=True) as caught:  # the default two-A100 setting says nothing
        warnings.simplefilter("always")
        simulate(["+policy=mcsf", "+demand=high", *FAST])
    assert not [w for w in caught if "timing model" in str(w.message)]


def test_vocab_mismatch_is_named_up_front():
    with pytest.raises(ConfigError, match=r"vocab_size=12345 but its profile .* vocab_size 32768"):
        simulate(["+policy=mcsf", "+demand=high", "latency=vidur", "model.vocab_size=12345", *FAST[1:]])


def test_damaged_predictor_cache_is_rebuilt_not_fatal(tmp_path):
    from kvstudy.latency.tables import VidurTables

    path = tmp_path / "tables.npz"
    path.write_bytes(b"PK\x03\x04 cut short")
    with pytest.warns(UserWarning, match="damaged predictor cache .* rebuilding it"):
        assert VidurTables.load(path) is None


@pytest.mark.slow  # over about 4 s (measured 4.3-14 s, issue 54's fast-tier budget)
def test_interrupted_run_keeps_what_is_done(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "kvstudy", "+policy=mcsf", "+demand=high", "latency=unit",
                             "workload.num_requests=400000", "engine.progress=true", f"hydra.run.dir={tmp_path}"],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = ""
    deadline = time.time() + 120
    while "req" not in seen and time.time() < deadline:  # the progress bar: the engine loop has started
        seen += proc.stderr.read(1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted" and 0 < summary["completed"] < 400000
    assert "interrupted after" in summary["message"]
    assert len(pd.read_parquet(tmp_path / "requests.parquet")) == 400000
    from kvstudy.running.outputs import is_complete

    assert not is_complete(tmp_path)  # a resumed sweep runs it again


def test_a_users_own_model_lives_in_their_own_folder(tmp_path):
    from kvstudy.running.paths import CONF_DIR, load_model_arch

    (tmp_path / "model").mkdir()
    text = (CONF_DIR / "model" / "llama2_70b.yaml").read_text().replace("name: llama2_70b", "name: my_llama")
    (tmp_path / "model" / "my_llama.yaml").write_text(text)
    assert load_model_arch(str(tmp_path / "model" / "my_llama.yaml")).name == "my_llama"  # the profile builder's way
    proc = cli("+policy=mcsf", "+demand=high", f"hydra.searchpath=[file://{tmp_path}]", "model=my_llama", *FAST,
               f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["model"] == "my_llama"
    proc = cli("+policy=mcsf", "+demand=high", "model=my_llama", *FAST, f"hydra.run.dir={tmp_path / 'x'}")
    assert proc.returncode == 2 and "unknown model 'my_llama'" in proc.stderr
