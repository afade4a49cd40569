"""Bad input ends in one clear line naming the field or file and what is allowed."""
import shutil

import numpy as np
import pandas as pd
import pytest

from kvstudy import api
from kvstudy.errors import ConfigError, DataError

FAST = ["latency=linear", "engine.progress=false", "workload.num_requests=20"]


def run(overrides, tmp_path):
    return api.run(api.compose(overrides), tmp_path)


def test_model_tp_without_profiles(tmp_path):
    with pytest.raises(ConfigError, match=r"does not divide model 'opt_13b'.*allowed"):
        run(["+policy=mcsf", "+demand=high", "model=opt_13b", "hardware.tensor_parallel=3"] + FAST, tmp_path)
    root = tmp_path / "profiles"
    shutil.copytree(api.CONF_DIR.parent / "profiles" / "network", root / "network")
    with pytest.raises(ConfigError, match="no profiles for model 'llama2_70b'.*profiled models: none"):
        run(["+policy=mcsf", "+demand=high", f"hardware.profiles.root={root}", "latency=vidur"] + FAST[1:], tmp_path)


def test_profile_missing_column(tmp_path):
    compute = tmp_path / "c"
    compute.mkdir()
    src = api.CONF_DIR.parent / "profiles/compute/a100/llama2_70b"
    pd.read_csv(src / "mlp.csv").drop(columns=["time_stats.mlp_up_proj.median"]).to_csv(compute / "mlp.csv", index=False)
    shutil.copy(src / "attention.csv", compute / "attention.csv")
    with pytest.raises(DataError, match=r"mlp.csv is missing column\(s\) \['time_stats.mlp_up_proj.median'\]"):
        run(["+policy=mcsf", "+demand=high", f"hardware.profiles.compute_dir={compute}", "latency=vidur"] + FAST[1:],
            tmp_path)


@pytest.mark.parametrize("value", [0, -5, "lots"])
def test_capacity_must_be_positive(value, tmp_path):
    with pytest.raises(ConfigError, match="memory.capacity_tokens"):
        run(["+policy=mcsf", "+demand=high", f"memory.capacity_tokens={value}"] + FAST, tmp_path)


def test_prompt_longer_than_context(tmp_path):
    pd.DataFrame({"prompt_tokens": [10, 5000], "output_tokens": [3, 3], "arrival_time": [0, 1]}).to_csv(
        tmp_path / "t.csv", index=False)
    with pytest.raises(ConfigError, match="prompt of 5000 tokens, longer than .* max_model_len=4096"):
        run(["+policy=mcsf", "workload=trace", f"workload.path={tmp_path}/t.csv"] + FAST[:2], tmp_path)


def test_unknown_names_list_choices():
    with pytest.raises(ConfigError, match="unknown policy 'nope'; allowed: .*mcsf"):
        api.compose(["+policy=nope"])
    with pytest.raises(ConfigError, match="unknown model 'gpt5'; allowed: .*llama2_70b"):
        api.compose(["+policy=mcsf", "model=gpt5"])


def test_a_mistyped_option_is_answered_with_the_one_it_resembles():
    with pytest.raises(ConfigError, match=r"unknown policy 'mscf'; allowed: .*; did you mean 'mcsf'\?$"):
        api.compose(["+policy=mscf"])
    with pytest.raises(ConfigError, match=r"unknown hardware 'a100_tp3'; .*did you mean 'a100_tp\d'\?$"):
        api.compose(["+policy=mcsf", "hardware=a100_tp3"])
    with pytest.raises(ConfigError) as nothing_near:
        api.compose(["+policy=zzzz"])
    assert "did you mean" not in str(nothing_near.value)


@pytest.mark.parametrize("frame,match", [
    ({"prompt_tokens": [1, 2], "arrival_time": [0, 1]}, r"missing column for 'output_tokens'"),
    ({"prompt_tokens": [1, np.nan], "output_tokens": [3, 3]}, r"'prompt_tokens' row 1 has value nan"),
    ({"prompt_tokens": [1, 4], "output_tokens": [3, -2]}, r"'output_tokens' row 1 has value -2"),
])
def test_bad_traces(frame, match, tmp_path):
    pd.DataFrame(frame).to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(DataError, match=match):
        run(["+policy=mcsf", "+demand=high", "workload=trace", f"workload.path={tmp_path}/t.csv"] + FAST[:2], tmp_path)


def test_unfittable_request_is_rejected_not_looped(tmp_path):
    pd.DataFrame({"prompt_tokens": [10, 60, 10], "output_tokens": [5, 50, 5], "arrival_time": [0, 1, 2]}).to_csv(
        tmp_path / "t.csv", index=False)
    summary = run(["+policy=mc_benchmark", "workload=trace", f"workload.path={tmp_path}/t.csv",
                   "memory.capacity_tokens=100"] + FAST[:2], tmp_path)
    assert summary["completed"] == 2 and summary["rejected"] == 1
    assert "rejected" in summary["message"]


def test_unsorted_timestamps_warn_with_count(tmp_path):
    pd.DataFrame({"prompt_tokens": [1, 2, 3], "output_tokens": [3, 3, 3], "arrival_time": [2, 0, 1]}).to_csv(
        tmp_path / "t.csv", index=False)
    with pytest.warns(UserWarning, match="re-sorted, 3 rows moved"):
        run(["+policy=mcsf", "workload=trace", f"workload.path={tmp_path}/t.csv"] + FAST[:2], tmp_path)


def test_no_policy_and_no_demand_messages(tmp_path):
    with pytest.raises(ConfigError, match="add \\+policy=NAME with NAME one of: " + ", ".join(api.options("policy"))):
        run(FAST, tmp_path)
    with pytest.raises(ConfigError, match="add \\+demand=NAME with NAME one of: high, low, offline"):
        run(["+policy=mcsf"] + FAST, tmp_path)


def test_tp_size_missing_from_profiles(tmp_path):
    with pytest.raises(ConfigError, match=r"no profile rows at tensor_parallel=16 .* profiled TP sizes: \[1, 2, 4, 8\]"):
        run(["+policy=mcsf", "+demand=high", "hardware.tensor_parallel=16", "latency=vidur"] + FAST[1:], tmp_path)


def test_a_key_the_chosen_option_does_not_take_is_named():
    # ++ adds a key Hydra does not know; memory=paper has no decode block check (only memory=paged does)
    cfg = api.compose(["+policy=mcsf", "+demand=high", "++memory.decode_block_check=boundary",
                       "workload.num_requests=20", "latency=linear"])
    with pytest.raises(ConfigError, match=r"memory.decode_block_check: not a setting of memory 'paper'"):
        api.simulate(cfg)
