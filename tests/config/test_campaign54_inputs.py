"""Issue 54's fourth held-out campaign, the kinds about configs and inputs (mechanisms, each with the cases that found
it): the user's own config files read before Hydra (kvstudy/config/user_files.py); reproduce's pre-check composing
every run with the overrides (kvstudy/running/precheck.py); settings without effect warned, contradictory ones refused
(kvstudy/running/no_effect.py, kvstudy/config/validate.py ``_check_hardware``); hints that name what is allowed; and
the remaining tracebacks, each now one line."""
import json
import subprocess
import sys
import warnings

import numpy as np
import pandas as pd
import pytest

from kvstudy import api
from kvstudy.config.user_files import check_option_file
from kvstudy.config.validate import check_overrides
from kvstudy.errors import ConfigError, DataError
from kvstudy.running.paths import CONF_DIR, REPO_ROOT

FAST = ["latency=unit", "engine.progress=false", "workload.num_requests=20"]
A100_TP2 = (CONF_DIR / "hardware" / "a100_tp2.yaml").read_text().replace("name: a100_tp2", "name: my_hw")
AFTER = A100_TP2.count("\n") + 1  # the line of a key appended to it


def cli(*args, module="kvstudy", cwd=REPO_ROOT, timeout=300):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def user_conf(tmp_path, group, name, body):
    """A user's config folder with one option file; the overrides that choose it."""
    folder = tmp_path / "conf" / group
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_bytes(body if isinstance(body, bytes) else body.encode())
    return path, [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", f"{group}={name}"]


# --- 1. the user's own config files ----------------------------------------------------------------------------------
@pytest.mark.parametrize("body,line,words", [
    ("name: my_hw\ndevice: [a100\n", 3, "while parsing a flow sequence at line 2, column 9"),
    ("name: my_hw\n\tdevice: a100\n", 2, "found character '\\t' that cannot start any token"),
    (A100_TP2 + "device: h100\n", AFTER, "found duplicate key device"),
    (A100_TP2 + "x: !!python/object/apply:os.system ['echo hi']\n", AFTER, "tag '!!python/object/apply:os.system'"),
])
def test_a_user_file_yaml_cannot_read_is_one_line_with_file_and_line(tmp_path, body, line, words):
    path, overrides = user_conf(tmp_path, "hardware", "my_hw", body)
    with pytest.raises(ConfigError) as err:
        check_overrides(["+policy=vllm", "+demand=high", *overrides])
    message = str(err.value)
    assert message.startswith(f"{path}, line {line}, column ") and words in message and "\n" not in message
    assert "allowed: a UTF-8 YAML mapping" in message


def test_a_latin1_byte_is_named_with_its_line(tmp_path):
    path, overrides = user_conf(tmp_path, "hardware", "my_hw", b"name: my_hw\ndevice: a100 # caf\xe9\n")
    with pytest.raises(ConfigError, match=rf"^{path}, line 2: byte 0xe9 is not UTF-8 text; save the file as UTF-8"):
        api.compose(["+policy=vllm", *overrides])


def test_a_user_file_that_hydra_would_stop_on_is_one_line_on_the_command_line(tmp_path):
    path, overrides = user_conf(tmp_path, "hardware", "my_hw", "name: my_hw\ndevice: [a100\n")
    out = cli("+policy=vllm", "+demand=high", *overrides, *FAST)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [out.stderr.strip()] and out.stderr.startswith(f"error: {path}, line 3")


def test_a_yaml_list_is_said_to_be_no_mapping(tmp_path):
    path, overrides = user_conf(tmp_path, "hardware", "my_hw", "- a\n- b\n")
    with pytest.raises(ConfigError, match=rf"^{path}: a YAML list, not a mapping; allowed: a mapping of hardware "
                                          r"settings"):
        check_overrides(["+policy=vllm", *overrides])


def test_an_unknown_key_of_a_user_file_is_refused_with_the_settings_there_are(tmp_path):
    path, overrides = user_conf(tmp_path, "hardware", "my_hw", A100_TP2 + "hbm_gbps: 2000\n")
    with pytest.raises(ConfigError) as err:
        api.compose(["+policy=vllm", *overrides])
    assert str(err.value).startswith(f"{path}, line {AFTER}: hbm_gbps is not a setting of hardware; allowed: ")
    assert "pcie_gbps" in str(err.value) and "tensor_parallel" in str(err.value)
    # the same file without the key composes and runs
    path.write_text(A100_TP2)
    assert api.compose(["+policy=vllm", *overrides]).hardware.name == "my_hw"


def test_an_unknown_key_of_a_memory_option_that_inherits_its_target_is_refused(tmp_path):
    body = "defaults:\n  - paged_offload\n  - _self_\nname: my_mem\noffload:\n  host_gb: 32\n  hbm: 3\n"
    path, overrides = user_conf(tmp_path, "memory", "my_mem", body)
    with pytest.raises(ConfigError, match=rf"^{path}, line 7: offload.hbm is not a setting of memory; allowed: .*"
                                          r"offload.host_gb"):
        check_overrides(["+policy=vllm", *overrides])


def test_a_user_policy_on_a_known_target_with_a_key_it_does_not_take_is_refused(tmp_path):
    path, overrides = user_conf(tmp_path, "policy", "mine", "_target_: kvstudy.policies.mcsf.MCSF\nname: mine\n"
                                                            "aging: 0\nmargin: 0.1\n")
    with pytest.raises(ConfigError, match=rf"^{path}, line 3: aging is not a setting of policy; allowed: admission, "
                                          r"avg_batch_time, margin, name, prefix_aware$"):
        check_overrides([overrides[0], "+policy=mine"])
    path.write_text("_target_: kvstudy.policies.mcsf.MCSF\nname: mine\nmargin: 0.1\n")
    check_overrides([overrides[0], "+policy=mine", "+demand=high"])


def test_every_option_of_kvstudys_own_conf_passes_the_user_file_check():
    """The check refuses nothing kvstudy itself ships (so it can only refuse a user's mistake)."""
    checked = 0
    for group in sorted(p for p in CONF_DIR.iterdir() if p.is_dir()):
        for path in sorted(group.glob("*.yaml")):
            check_option_file(group.name, path.stem, path)
            checked += 1
    assert checked > 100


def test_a_quoted_name_with_a_space_is_taken_as_hydra_reads_it(tmp_path):
    _, overrides = user_conf(tmp_path, "hardware", "my hw", A100_TP2)
    quoted = [overrides[0], "hardware='my hw'"]
    check_overrides(["+policy=vllm", "+demand=high", *quoted])  # listed among the allowed names, and taken
    assert api.compose(["+policy=vllm", *quoted]).hardware.name == "my_hw"
    with pytest.raises(ConfigError, match=r"unknown hardware 'my hx'; allowed: .*my hw"):
        check_overrides(["+policy=vllm", overrides[0], "hardware='my hx'"])


# --- 2. reproduce's pre-check: values too, --dry-run too --------------------------------------------------------------
@pytest.mark.parametrize("paper,override,match", [
    ("offload", "memory.offload.host_gb=-1", r"^memory.offload.host_gb=-1: allowed a number > 0 .* \(in run 1 of 6: "),
    ("offload", "memory.offload.choice=bogus", r"^memory.offload.choice='bogus': allowed auto, load, recompute"),
    ("hardware", "+demand=high", r"^\+demand=high: experiment 'hardware\w*' chooses demand already "
                                 r"\(demand=\w+\); allowed: demand=high \(without \+"),
    ("hardware", "cluster.replicas=2", r"^demand.load=7.0 is relative to one replica's capacity; with cluster."
                                       r"replicas=2 give demand.rate instead .* in experiment \d+/\d+ of hardware"),
])
def test_reproduce_refuses_a_value_every_run_would_refuse_before_running(paper, override, match):
    from kvstudy.reproduce import check_step_overrides

    with pytest.raises(ConfigError, match=match):
        check_step_overrides([paper], None, [override])


def test_reproduce_precheck_passes_good_overrides_and_counts_every_run():
    from kvstudy.reproduce import check_step_overrides
    from kvstudy.running.precheck import check_runs

    check_step_overrides(["offload"], None, ["memory.offload.load=overlapped"])
    from omegaconf import OmegaConf

    params = OmegaConf.load(CONF_DIR / "experiment" / "offload_mooncake.yaml").hydra.sweeper.params
    runs = int(np.prod([len(str(v).split(",")) for v in params.values()]))  # 3 policies x 5 host sizes x 2 loads
    assert check_runs(["+experiment=offload_mooncake"]) == runs


def test_a_sweep_key_the_replaced_option_lacks_is_a_user_error_naming_it():
    """``demand=high`` replaces the hardware study's demand=relative, whose demand.load its sweep sets: each run used
    to fail with an internal error; the pre-check (and each run, kvstudy/running/sweep_launcher.py) names the key."""
    from kvstudy.running.precheck import check_runs

    with pytest.raises(ConfigError, match=r"^demand.load=7.0: demand 'high' of this run has no load; allowed: a key "
                                          r"its option has .* \(in run 1 of \d+: "):
        check_runs(["+experiment=hardware", "demand=high"])


def test_reproduce_dry_run_checks_values(tmp_path):
    out = cli("offload", "--dry-run", "--", "memory.offload.host_gb=-1", module="kvstudy.reproduce", cwd=tmp_path)
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert out.returncode == 2 and len(errors) == 1 and "memory.offload.host_gb=-1: allowed" in errors[0]
    assert "python -m kvstudy +experiment" not in out.stdout  # nothing planned as if it would run


# --- 3. no effect, no word: warned; contradictions: refused --------------------------------------------------------
def notes(overrides):
    from kvstudy.running.no_effect import offload_notes, parallel_notes

    cfg = api.compose(["+policy=vllm", *overrides])
    return offload_notes(cfg) + parallel_notes(cfg)


@pytest.mark.parametrize("overrides,expected", [
    (["memory.offload.disk_read_gbps=3"], "memory.offload.disk_read_gbps=3 has no effect without a disk tier"),
    (["memory.offload.host_gb=null", "memory.offload.host_read_gbps=10"],
     "memory.offload.host_read_gbps=10 has no effect without a host tier"),
    (["memory.offload.shared=true"], "memory.offload.shared=true has no effect with one replica"),
    (["memory.offload.host_gb=1e-4"], "memory.offload.host_gb=0.0001 holds no block: one block of 16 tokens of model "
                                      "'llama2_70b' is 2,621,440 B per GPU"),
])
def test_an_offload_setting_without_effect_is_warned(overrides, expected):
    said = notes(["memory=paged_offload", *overrides])
    assert len(said) == 1 and said[0].startswith(expected)


def test_the_offload_tiers_as_shipped_warn_nothing():
    assert notes(["memory=paged_offload"]) == []
    assert notes(["memory=paged_offload", "memory.offload.disk_gb=100", "memory.offload.disk_read_gbps=3"]) == []


def test_tensor_parallel_above_the_kv_heads_is_warned_and_a_split_head_refused():
    said = notes(["hardware=a100_tp8", "hardware.tensor_parallel=16", "latency=linear"])
    assert said == ["hardware.tensor_parallel=16 is above model 'llama2_70b' num_kv_heads=8: vLLM keeps a copy of each "
                    "KV head on 2 GPUs, so a token's KV takes as much memory per GPU as at tensor_parallel=8 (a larger "
                    "TP adds no KV capacity per GPU)"]
    assert notes(["hardware=a100_tp8"]) == []
    with pytest.raises(ConfigError, match=r"hardware.tensor_parallel=16: above model 'm' num_kv_heads=12 and not a "
                                          r"multiple of it"):
        api.check_config(api.compose(["+policy=vllm", "hardware=a100_tp8", "hardware.tensor_parallel=16",
                                      "model.name=m", "model.num_q_heads=48", "model.num_kv_heads=12",
                                      "model.embedding_dim=6144", "latency=linear"]))


def test_a_warning_reaches_the_run():
    with pytest.warns(UserWarning, match="memory.offload.shared=true has no effect with one replica"):
        api.simulate(api.compose(["+policy=vllm", "+demand=high", "memory=paged_offload", "memory.offload.shared=true",
                                  "model=llama31_8b", "hardware=a100_tp1", "memory.capacity_tokens=100000", *FAST]))


@pytest.mark.parametrize("overrides,match", [
    (["hardware=h200_tp1", "hardware.calibrated=true", "latency=linear"],
     r"^hardware.calibrated=true: device 'h200' borrows h100's fitted efficiencies \(no measurement of h200\); "
     r"allowed: false"),
    (["hardware.device=h999", "latency=linear"],
     r"^hardware.device='h999': no GPU of that name; allowed: a100, h100, h200, a40, l4 "),
    (["hardware.device=H100", "latency=unit"],
     r"^hardware.device='H100': no GPU of that name \(names are lower case: 'h100'\); allowed: a100, h100"),
    (["hardware.node=nope", "latency=linear"], r"^hardware.node='nope': no network profiles of that name"),
    (["regime=authors", "cluster.replicas=2"], r"^cluster.replicas=2: engine.arrivals=authors_code"),
])
def test_contradictory_settings_are_refused_under_any_latency_model(overrides, match):
    with pytest.raises(ConfigError, match=match):
        api.check_config(api.compose(["+policy=mcsf", "+demand=high", *overrides]))


def test_a_calibrated_device_with_its_own_profiles_may_say_calibrated(tmp_path):
    api.check_config(api.compose(["+policy=mcsf", "hardware=h200_tp1", "hardware.calibrated=true",
                                  f"hardware.profiles.root={tmp_path}"]))


def test_a_hash_block_size_unlike_the_traces_is_said():
    from kvstudy.workloads.trace import _hash_segments

    prompts = pd.Series([700, 1500, 2600, 5000, 6758])
    ids = pd.Series([list(range(-(-p // 512))) for p in prompts])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _hash_segments(ids, prompts, 512, "t.jsonl")  # the trace's own: nothing said
    with pytest.warns(UserWarning, match=r"t.jsonl: workload.hash_block_size=500 is not the trace's block size: every "
                                         r"row's id count fits block size .*give workload.hash_block_size=512"):
        _hash_segments(ids, prompts, 500, "t.jsonl")


def test_cfg_job_says_what_the_printed_configs_run_would_refuse():
    out = cli("--cfg", "job", "+policy=mcsf", "seed=-1")
    assert out.returncode == 0 and "seed: -1" in out.stdout
    assert out.stderr.strip() == "warning: a run of this config would stop: seed=-1: allowed a whole number >= 0 " \
                                 "and <= 4,294,967,295"


# --- 4. hints that help ----------------------------------------------------------------------------------------------
def test_profiles_build_suggests_the_lower_case_device():
    out = cli("build", "--device", "H100", "--models", "llama32_1b", module="kvstudy.profiles")
    assert out.returncode == 2 and out.stderr.strip() == (
        "error: device 'H100' (names are lower case: 'h100'): allowed a100, h100, h200, a40, l4 "
        "(kvstudy/profiles/devices.py)")


def test_profiles_of_an_unknown_device_are_not_said_to_be_buildable(tmp_path):
    (tmp_path / "compute").mkdir()
    base = ["+policy=mcsf", "+demand=high", "hardware.device=h999", f"hardware.profiles.root={tmp_path}",
            "engine.progress=false", "workload.num_requests=5"]
    with pytest.raises(ConfigError, match=r"^hardware.pcie_gbps=null: device 'h999' is not in "
                                          r"kvstudy/profiles/devices.py, so its host link is not known; allowed: "
                                          r"hardware.pcie_gbps=<GB/s per direction>"):
        api.simulate(api.compose(base))  # the registry's number, which a device of one's own does not have
    with pytest.raises(ConfigError) as err:
        api.simulate(api.compose(base + ["hardware.pcie_gbps=31.5"]))
    assert "profiles build" not in str(err.value) and "the profile builder knows only a100, h100" in str(err.value)


@pytest.mark.parametrize("overrides,match", [
    (["+demand=high", "demand.rate=1e-9"],
     r"^demand.rate=1e-09: a Poisson rate of 1e-09 requests/s, at which 20 requests arrive over .* s, past the "
     r"2\*\*33 = 8,589,934,592 s .*; allowed: demand.rate >= 4.7e-09 for 20 requests"),
    (["workload=sharegpt", "+demand=table1_rate", "workload.rate=1e-9"],
     r"^workload.rate=1e-09 \(x demand.scale=1\): a Poisson rate .*allowed: workload.rate >= 4.7e-09"),
])
def test_a_rate_too_small_is_named_by_its_key_and_bound(overrides, match):
    with pytest.raises(ConfigError, match=match):
        api.simulate(api.compose(["+policy=mcsf", *FAST, *overrides]))


def test_a_relative_load_too_small_is_named_by_its_key():
    with pytest.raises(ConfigError, match=r"^demand.load=1e-09 \(x this hardware's capacity\): a Poisson rate of "
                                          r".*allowed: demand.load >= "):
        api.simulate(api.compose(["+policy=vllm", "+demand=relative", "demand.load=1e-9", "latency=linear",
                                  "engine.progress=false", "workload.num_requests=20"]))


# --- 5. remaining tracebacks, each one line -------------------------------------------------------------------------
def test_an_unset_environment_variable_in_the_run_folder_is_one_line(monkeypatch):
    monkeypatch.delenv("KVSTUDY_NO_SUCH_VAR", raising=False)
    out = cli("+policy=mcsf", "+demand=high", *FAST, "hydra.run.dir=/tmp/${oc.env:KVSTUDY_NO_SUCH_VAR}")
    assert out.returncode == 2 and out.stderr.strip() == (
        "error: hydra.run.dir=/tmp/${oc.env:KVSTUDY_NO_SUCH_VAR}: the environment variable KVSTUDY_NO_SUCH_VAR is not "
        "set; allowed: set it (export KVSTUDY_NO_SUCH_VAR=...), or give ${oc.env:KVSTUDY_NO_SUCH_VAR} a default: "
        "${oc.env:KVSTUDY_NO_SUCH_VAR,VALUE}")
    check_overrides(["+policy=mcsf", "hydra.run.dir=/tmp/${oc.env:KVSTUDY_NO_SUCH_VAR,x}"])  # a default: fine


def test_a_shared_pool_on_a_node_without_profiles_is_one_line(tmp_path):
    from kvstudy.costs.transfer import network_reader

    (tmp_path / "network" / "a100_dgx").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"memory.offload.shared=true reads the link between nodes from .*nope/"
                                          r"send_recv.csv: no such file .*allowed: a node with one there \(none\)"):
        network_reader(tmp_path / "network" / "nope" / "send_recv.csv")


def test_figures_only_without_the_notebooks_is_one_line(tmp_path, monkeypatch, capsys):
    import kvstudy.reproduce as reproduce

    monkeypatch.setattr(reproduce, "NOTEBOOKS_DIR", tmp_path / "notebooks")
    monkeypatch.chdir(tmp_path)
    assert reproduce.main(["offload", "--figures-only"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {tmp_path / 'notebooks' / '08_offload.ipynb'}: no such notebook") and "\n" not in err


def test_calibrate_names_a_garbage_cell(tmp_path):
    from kvstudy.profiles.calibration import load_measured_mlp
    from kvstudy.running.paths import SHARED_REFERENCE

    source = SHARED_REFERENCE / "vidur-data" / "profiling" / "compute" / "a100" / "microsoft" / "phi-2" / "mlp.csv"
    if not source.is_file():
        pytest.skip("Vidur's measured profiles are not in the shared reference data")
    df = pd.read_csv(source).astype({"time_stats.mlp_act.median": object})
    df.loc[5, "time_stats.mlp_act.median"] = "garbage"
    path = tmp_path / "profiling" / "compute" / "a100" / "m" / "x" / "mlp.csv"
    path.parent.mkdir(parents=True)
    df.to_csv(path, index=False)
    with pytest.raises(DataError, match=rf"^{path}: column time_stats.mlp_act.median has 'garbage' on line 7; allowed: "
                                        r"finite numbers \(1 of \d+ rows are not\)"):
        load_measured_mlp(tmp_path, "a100")


@pytest.mark.parametrize("content,match", [
    ({}, "an empty object"),
    ({"device": "a100"}, "no 'mlp_ops' object"),
    ({"device": "h999", "mlp_ops": {}}, "its 'device' is 'h999', not one of a100, h100"),
])
def test_profiles_build_with_a_calibration_it_cannot_read_is_one_line(tmp_path, capsys, content, match):
    from kvstudy.profiles.__main__ import main

    path = tmp_path / "cal.json"
    path.write_text(json.dumps(content))
    assert main(["build", "--calibration", str(path), "--models", "llama32_1b", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: calibration file {path}: {match}") and not (tmp_path / "out" / "compute").exists()


def test_the_shipped_calibrations_pass_the_check():
    from kvstudy.profiles.calibration import calibration_file, load_calibration

    for device in ("a100", "h100"):
        assert load_calibration(calibration_file(device))["device"] == device


def test_adversary_with_m_not_an_even_square_is_one_line(capsys):
    from kvstudy.optimum.__main__ import main

    assert main(["adversary", "--M", "16", "5"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --M 5: allowed the square of an even number (4, 16, 36, 64, ..., 65,536): the short requests arrive "
        "sqrt(M)/2 rounds before M, a whole number of rounds")
