"""Issue 35's friction list, as a new user met it: each item answered (docs/policies.md is tested in
test_policy_guide.py, events in test_events.py, provenance and resume in test_provenance.py)."""
import json
import subprocess
import sys
import textwrap
import warnings

import pandas as pd
import pytest

from kvstudy import analysis, api
from kvstudy.errors import ConfigError
from kvstudy.running.paths import REPO_ROOT

FAST = ["+demand=high", "latency=linear", "workload.num_requests=30", "engine.progress=false"]


def cli(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "kvstudy", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


# 1. one over-context key --------------------------------------------------------------------------------------
@pytest.fixture
def long_prompt_trace(tmp_path):
    path = tmp_path / "t.csv"
    pd.DataFrame({"prompt_tokens": [100, 4107, 200, 3000], "output_tokens": [10, 10, 20, 2000],
                  "arrival_time": [0.0, 0.1, 0.2, 0.3]}).to_csv(path, index=False)
    return path


def test_a_prompt_over_the_context_names_the_key_that_drops_it(long_prompt_trace):
    base = ["+policy=mcsf", "workload=trace", f"workload.path={long_prompt_trace}", "latency=linear",
            "engine.progress=false"]
    with pytest.raises(ConfigError, match=r"request 1 has a prompt of 4107 tokens.*workload.over_context=drop"):
        api.simulate(api.compose(base))
    with pytest.warns(UserWarning, match=r"dropped 1 of 4 requests with prompts longer"):
        result, _ = api.simulate(api.compose(base + ["workload.over_context=drop"]))
    assert result.requests.request_id.tolist() == [0, 2]  # the prompt over the context and the total over it
    with pytest.warns(UserWarning, match="output capped"):
        result, _ = api.simulate(api.compose(base + ["workload.over_context=truncate"]))
    assert result.requests.request_id.tolist() == [0, 2, 3]
    with pytest.warns(UserWarning, match=r"dropped 1 of 4 .*\(workload.drop_over_context=true, the older spelling of "
                                         r"workload.over_context=drop\)"):
        result, _ = api.simulate(api.compose(base + ["workload.drop_over_context=true"]))
    assert result.requests.request_id.tolist() == [0, 2, 3]  # the old key: long prompts only (its results unchanged)


# 4/6. a policy's rejected decision: step, time, requests; in the run folder; not on the bar's line -------------------
GREEDY = textwrap.dedent("""
    from kvstudy.policies.step import Decision, StepPolicy

    class Greedy(StepPolicy):
        \"\"\"Starts every waiting request at once, memory or not: the engine must refuse it.\"\"\"
        name = "greedy"
        preemptive = True

        def __init__(self, name="greedy"):
            self.name = name

        def step(self, view):
            total = view.prefill_target
            return Decision(prefill=[(i, total[i]) for i in view.waiting], decode_all=True)
""")


def test_a_rejected_decision_names_step_time_and_requests(tmp_path):
    (tmp_path / "greedy_policy.py").write_text(GREEDY)
    (tmp_path / "conf" / "policy").mkdir(parents=True)
    (tmp_path / "conf" / "policy" / "greedy.yaml").write_text(
        "defaults:\n  - override /memory@_global_.memory: paged\n_target_: greedy_policy.Greedy\nname: greedy\n")
    import os
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    run_dir = tmp_path / "run"
    proc = cli(f"hydra.searchpath=[file://{tmp_path}/conf]", "+policy=greedy", "+demand=high", "latency=linear",
               "workload.num_requests=400", "memory.capacity_tokens=2000", f"hydra.run.dir={run_dir}", env=env)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: iteration ") and "Traceback" not in proc.stderr
    assert "policy 'greedy' needs" in lines[-1] and "it starts request(s)" in lines[-1] and "(time " in lines[-1]
    assert (run_dir / "error.txt").read_text().strip() == lines[-1][len("error: "):]


def test_a_users_module_that_fails_to_import_is_named(tmp_path):
    (tmp_path / "broken_policy.py").write_text("import no_such_package_here\n")
    cfg = api.compose(["+policy=mcsf", *FAST, "policy._target_=broken_policy.P"])
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(ConfigError, match=r"policy._target_=broken_policy.P: importing module 'broken_policy' failed "
                                              r"with ModuleNotFoundError: No module named 'no_such_package_here' "
                                              r"\(.*broken_policy.py, line 1\)"):
            api.simulate(cfg)
    finally:
        sys.path.remove(str(tmp_path))
    with pytest.raises(ConfigError, match=r"no module named 'not_on_the_path'.*PYTHONPATH"):
        api.simulate(api.compose(["+policy=mcsf", *FAST, "policy._target_=not_on_the_path.P"]))


# 7. settings without effect are said; the summary has units; a run serving nothing fails ---------------------------
@pytest.mark.parametrize("overrides,said", [
    (["+policy=sarathi", "swap=vllm_blocks"], "swap=vllm_blocks has no effect: policy 'sarathi' recomputes"),
    (["+policy=mcsf", "swap=vllm_blocks"], "swap=vllm_blocks has no effect: memory=paper never swaps"),
    (["+policy=mcsf", "memory=paged", "swap=vllm_blocks"], "is admission-only"),
    (["+policy=vllm", "predictor=gaussian_noise"], "predictor.sigma=0 predicts every length exactly"),
    (["+policy=vllm", "predictor=uniform_noise", "predictor.epsilon=0"], "predictor.epsilon=0 predicts"),
    (["+policy=vllm", "router=least_kv"], "router=least_kv has no effect with one replica"),
])
def test_settings_without_effect_are_said(overrides, said):
    with pytest.warns(UserWarning, match=said):
        api.simulate(api.compose(overrides + FAST))


def test_settings_with_effect_are_not():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        api.simulate(api.compose(["+policy=vllm", "policy.preemption_mode=swap", "swap=vllm_blocks",
                                  "predictor=gaussian_noise", "predictor.sigma=10"] + FAST))


def test_summary_units_and_a_run_that_does_not_complete(tmp_path):
    proc = cli("+policy=vllm", *FAST, f"hydra.run.dir={tmp_path / 'a'}")
    assert proc.returncode == 0, proc.stderr
    assert "e2e_latency (s)" in proc.stdout and "throughput (tokens/s)" in proc.stdout
    proc = cli("+policy=vllm", *FAST, "latency=unit", "policy.max_num_batched_tokens=10", f"hydra.run.dir={tmp_path / 'b'}")
    assert proc.returncode == 3
    assert proc.stderr.strip().splitlines()[-1].startswith("error: run ended with status stalled: no request was "
                                                           "served: policy 'vllm' ran no request")
    result, summary = api.simulate(api.compose(["+policy=mcsf", *FAST, "memory.capacity_tokens=16"]))
    assert summary["status"] == "nothing_served" and "all 30 were rejected" in summary["message"]


def test_output_folders_that_are_files(tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("")
    proc = cli("+policy=mcsf", *FAST, f"hydra.run.dir={a_file}")
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: hydra.run.dir={a_file}: is a file, not a folder; " \
                                                            f"choose another folder"


# 7. load_sweep leaves unfinished runs out --------------------------------------------------------------------------
def test_load_sweep_leaves_interrupted_runs_out(tmp_path):
    for seed in (0, 1):
        api.run(api.compose(["+policy=mcsf", *FAST, f"seed={seed}"]), tmp_path / f"s{seed}")
    summary = json.loads((tmp_path / "s1" / "summary.json").read_text())
    (tmp_path / "s1" / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}))
    df = analysis.load_sweep(tmp_path)
    assert df.seed.tolist() == [0] and df.attrs["incomplete"] == 1


# policy keys on a sweep that chooses the policy -----------------------------------------------------------------
@pytest.mark.slow  # over about 4 s (measured 4.3-14 s, issue 54's fast-tier budget)
def test_policy_keys_on_an_experiment_sweeping_policies(tmp_path):
    proc = cli("+experiment=rr_sjf_policies", "policy.steps_before_preemption=3", "workload.num_requests=40",
               "seed=0", "policy.preemption_mode=recompute", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    configs = sorted(tmp_path.rglob("resolved_config.yaml"))
    assert len(configs) == 4
    from omegaconf import OmegaConf
    assert {OmegaConf.load(c).policy.steps_before_preemption for c in configs} == {3}


def test_a_policy_key_some_swept_policies_lack(tmp_path):
    proc = cli("-m", "+policy=vllm,rr", "policy.steps_before_preemption=2", *FAST, f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert "policy.steps_before_preemption applies to rr; vllm: no such setting, run without it" in proc.stdout
    proc = cli("-m", "+policy=vllm,sarathi", "policy.steps_before_preemption=2", *FAST,
               f"hydra.sweep.dir={tmp_path / 'x'}")
    assert proc.returncode != 0
    assert "policy.steps_before_preemption: not a setting of any policy of this sweep" in proc.stderr


# 5. the README says what is measured and what kvstudy builds ------------------------------------------------------
def test_readme_says_what_is_measured_and_what_is_built():
    text = " ".join((REPO_ROOT / "README.md").read_text().split())
    assert "Vidur's trained execution-time predictor" not in text  # the profiles it trains on are kvstudy's
    assert "Vidur-schema profiles that kvstudy generates" in text and "profiles/README.md" in text
    assert "real A100 measurements" in text


# the new-user trial: a key of one's own policy, and an option not found -------------------------------------------
def test_keys_of_a_users_own_policy_and_options_not_found(tmp_path):
    from kvstudy.config.validate import check_overrides

    (tmp_path / "policy").mkdir()
    # a _target_ of one's own (MCSF's would refuse the file: it takes no aging, tests/config/test_campaign54_inputs.py)
    (tmp_path / "policy" / "mine.yaml").write_text("_target_: my_policies.Mine\nname: mine\naging: 0\n")
    search = f"hydra.searchpath=[file://{tmp_path}]"
    check_overrides([search, "+policy=mine", "policy.aging=100"])  # the user's own key is a key
    with pytest.raises(ConfigError, match="unknown key policy.aging"):
        check_overrides(["+policy=mcsf", "policy.aging=100"])  # without the search path it is not
    with pytest.raises(ConfigError, match=r"unknown policy 'mine'; allowed: .*add hydra.searchpath=\[file:///"):
        check_overrides(["+policy=mine"])
    with pytest.raises(ConfigError, match=rf"unknown policy 'minee'; .*looked in conf/policy/ and {tmp_path}/policy/"):
        check_overrides([search, "+policy=minee"])


# the review of issue 35: what a re-run, a foreign folder and a policy's own exception do --------------------------------
def test_a_finished_run_that_did_not_complete_still_fails_when_skipped(tmp_path):
    args = ["+policy=mcsf", *FAST, "memory.capacity_tokens=16", f"hydra.run.dir={tmp_path / 'r'}"]
    assert cli(*args).returncode == 3
    again = cli(*args)
    assert again.returncode == 3 and "complete already, skipped" in again.stdout
    assert "error: the finished run ended with status nothing_served" in again.stderr


def test_a_refused_folder_is_not_marked_failed(tmp_path):
    from kvstudy.running.sweep_callback import run_recording_errors

    out = tmp_path / "r"
    api.run(api.compose(["+policy=mcsf", *FAST]), out)
    with pytest.raises(ConfigError, match="different config"):
        run_recording_errors(api.compose(["+policy=mcsf", *FAST, "seed=3"]), out)
    assert not (out / "error.txt").exists()


def test_an_exception_inside_a_users_policy(tmp_path):
    import os
    (tmp_path / "raising_policy.py").write_text(textwrap.dedent("""
        from kvstudy.policies.base import Policy

        class Raising(Policy):
            name = "raising"

            def order(self, view):
                raise ValueError("my bug")

            def admit(self, view, order):
                return order
    """))
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "raising.yaml").write_text("_target_: raising_policy.Raising\nname: raising\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = cli(f"hydra.searchpath=[file://{tmp_path}]", "+policy=raising", *FAST, f"hydra.run.dir={tmp_path / 'r'}",
               env=env)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "raising_policy.py" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ValueError: my bug raised inside the run")
    assert "my bug" in (tmp_path / "r" / "error.txt").read_text()


@pytest.mark.parametrize("body,line", [
    ("class Mine(MCSF):\n    def __init__(self, k=-1, **kw):\n        if k < 0:\n            raise ValueError(f'k must be "
     ">= 0, got {k}')\n        super().__init__(**kw)\n",
     "error: policy 'mine' (my_policy.Mine): k must be >= 0, got -1"),
    ("class Mine(MCSF):\n    def __init__(self, **kw):\n        raise TypeError('window is no number')\n",
     "error: policy 'mine' (my_policy.Mine): window is no number"),
    ("def Mine(**kw):\n    return 3\n",
     "error: policy 'mine' (my_policy.Mine) built int 3, not a policy: a step policy has step(view) "
     "(kvstudy/policies/step.py), an admission policy order + admit (kvstudy/policies/base.py)"),
    ("class Mine:\n    name = 'mine'\n    def reset(self, seed):\n        pass\n",
     "error: policy 'mine' (my_policy.Mine) built Mine, not a policy: a step policy has step(view) "
     "(kvstudy/policies/step.py), an admission policy order + admit (kvstudy/policies/base.py)"),
    ("class Mine(MCSF):\n    def before_run(self, ctx):\n        return {'nonsense': 1}\n",
     "error: policy 'mine': before_run returns None or a dict with keys among ('direction',), got {'nonsense': 1}"),
])
def test_a_user_policys_own_checks_and_kvstudys_checks_of_it_are_config_errors(tmp_path, body, line):
    """Issue 46: a ValueError or TypeError from a user policy's __init__ (its parameter check, as the README asks),
    a _target_ that builds no policy and a before_run answer kvstudy cannot take are configuration errors naming the
    policy: one line, status 2, no traceback."""
    import os
    (tmp_path / "my_policy.py").write_text("from kvstudy.policies.mcsf import MCSF\n\n\n" + body)
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "mine.yaml").write_text("_target_: my_policy.Mine\nname: mine\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = cli(f"hydra.searchpath=[file://{tmp_path}]", "+policy=mine", *FAST, f"hydra.run.dir={tmp_path / 'r'}",
               env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == line


def test_policy_keys_name_folders_as_written_and_identical_runs_run_once(tmp_path):
    proc = cli("-m", "+policy=vllm,rr", "policy.steps_before_preemption=5,10", *FAST, f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    folders = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert len(folders) == 3 and not any("++" in f for f in folders)
    assert sum("policy.steps_before_preemption=" in f for f in folders) == 2
    assert "1 run(s) left out" in proc.stdout
