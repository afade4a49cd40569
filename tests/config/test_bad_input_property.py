"""Every key of every config group refuses bad values in ONE line naming that key (issue 35).

The keys are not listed here: they come from composing every option of every group (conf/) and from the schema
(kvstudy/config/schema.py), so a key added to a YAML is covered as soon as it exists, and a key the schema does not
declare fails ``test_the_schema_declares_every_key``. For each key, bad values of every kind its declaration
rules out are drawn (a wrong type, inf/nan, negative, zero, 1e30, a fraction where a whole number is due, just
past a bound) and checked in-process (``validate.check_config``: milliseconds each); a Hypothesis test draws more
of the same, derandomized so CI is reproducible. A few cases run the real command lines as a user would, with a
timeout that a hang (a FIFO as a trace) would hit.
"""
from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from omegaconf import OmegaConf, open_dict

from kvstudy import api
from kvstudy.errors import ConfigError, DataError
from kvstudy.running.paths import CONF_DIR, REPO_ROOT
from kvstudy.config.schema import SCHEMA, Key, key_spec
from kvstudy.config.validate import _leaves, check_config, check_overrides
from tests.compositions import compose_each

APPENDED = {"policy", "demand", "algo", "deployment"}
GROUP_DIRS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name not in ("hydra", "experiment"))
INF, NAN = float("inf"), float("nan")


def _option_overrides(experiments=None):
    """One override list per option of every group (and per experiment), each a config the schema must cover.
    ``experiments``: experiment -> whether it chooses its policy (composed once, ``_stored``)."""
    experiments = _stored()["experiments"] if experiments is None else experiments
    out = [["+policy=mcsf", "+demand=high"]]
    for group in GROUP_DIRS:
        for option in api.options(group):
            choice = f"{'+' if group in APPENDED else ''}{group}={option}"
            extra = [] if group in ("policy", "algo") else ["+policy=mcsf"]
            out.append([choice] + extra + ([] if group == "demand" else ["+demand=high"]))
    for option, own in experiments.items():  # an experiment without a policy of its own runs one of the sweep's
        out.append([f"+experiment={option}"] + ([] if own else ["+policy=mcsf"]))
    return out


@functools.lru_cache(maxsize=1)
def _stored() -> dict:
    """Every option's composition, composed once and shared out between the workers (tests/compositions.py)."""
    experiments = {key[0][len("+experiment="):]: "policy" in cfg for key, cfg in compose_each(
        "experiments", [[f"+experiment={option}"] for option in api.options("experiment")]).items()}
    return {"experiments": experiments, "configs": compose_each("options", _option_overrides(experiments))}


@functools.lru_cache(maxsize=None)
def _compose(overrides: tuple):
    stored = _stored()["configs"].get(overrides)
    return stored if stored is not None else api.compose(list(overrides))


def _groups_of(plain: dict):
    """(schema group name, its node) of a composed config, the root's own keys as group ''."""
    groups = {k for k in SCHEMA if k}
    yield "", {k: v for k, v in plain.items() if k not in groups}
    for name in sorted(groups):
        if isinstance(plain.get(name), dict):
            yield name, plain[name]


@functools.lru_cache(maxsize=1)
def cases():
    """(base overrides, full key, Key, present): every key of every option the schema knows, once each; keys the
    schema declares but no YAML sets (``latency.polynomial_degree``) are added to a config of that option."""
    found = {}
    for overrides in _option_overrides():
        cfg = _compose(tuple(overrides))
        plain = OmegaConf.to_container(cfg, resolve=True)
        for name, node in _groups_of(plain):
            group = SCHEMA[name]
            keys, _ = group.keys_for(node)
            option = node.get(group.by) if group.by else None
            present = {k for k, _ in _leaves(node, keys)}
            for key, spec in keys.items():
                full_key = f"{name}.{key}" if name else key
                if key.endswith(".*"):
                    matches = sorted(k for k in present if k.startswith(key[:-1]))  # one choice, every process
                    if not matches:
                        continue
                    key, full_key = matches[0], (f"{name}.{matches[0]}" if name else matches[0])
                ident = (name, option, key)
                if ident not in found or (key in present and not found[ident][3]):
                    found[ident] = (tuple(overrides), full_key, spec, key in present)
    return sorted(found.values(), key=lambda c: (c[1], c[0]))


def _bounds_bad(spec: Key):
    vals = []
    if spec.ge is not None:
        vals += [spec.ge - 1] if spec.kind == "whole" else [spec.ge - 1e-3 * max(1.0, abs(spec.ge)), -1.0]
    if spec.gt is not None:
        vals += [spec.gt, spec.gt - 1]
    if spec.le is not None:
        vals += [spec.le + 1 if spec.kind == "whole" else spec.le * 1.5 + 1]
    if spec.lt is not None:
        vals += [spec.lt, spec.lt + 1]
    if spec.kind == "whole" and spec.ge is not None and spec.ge >= 0:
        vals += [-1]
    if spec.kind == "whole" and (spec.ge is None or spec.ge >= 1):
        vals += [0]
    return vals


def bad_values(spec: Key) -> list:
    """Values ``spec`` must refuse, of every kind that applies to it."""
    if spec.kind in ("whole", "number"):
        vals = ["abc", "", True, False, [1], {"a": 1}, INF, -INF, NAN, 1e30, -1e30] + _bounds_bad(spec)
        if spec.kind == "whole":
            low = spec.ge if spec.ge is not None else 1
            vals += [low + 0.5, 2.5]
            if not spec.e_notation:
                vals += [float(max(low, 1))]  # 1.0 where an int is due (Hydra reads 1e3 as a float)
            if spec.power_of_two:
                vals += [3, 12]
    elif spec.kind == "flag":
        vals = ["maybe", "true", 1, 0, 0.5, [True]]
    elif spec.kind == "choice":
        vals = ["nope", 7, 1.5, True, [spec.choices[0]], spec.choices[0] + "x" if isinstance(spec.choices[0], str)
                else "x"]
    elif spec.kind == "text":
        vals = [7, 2.5, True, "", [1], INF]
    elif spec.kind == "any":  # a structure its own module reads (cluster.pools: kvstudy/cluster/pools.py)
        vals = ["abc", 5, True, [1], {}]
    else:  # list
        vals = ["abc", 5, [], [[1]]] + [[v] for v in bad_values(spec.item) if not isinstance(v, (list, dict))]
    if not spec.null:
        vals.append(None)
    if spec.auto:
        vals = [v for v in vals if v != "auto"] + ["Auto", "automatic"]
    if spec.kind == "any":  # the schema takes anything here: the module that reads it refuses these
        return vals
    return [v for v in vals if not spec.valid(v) or pytest.fail(f"{spec} takes the 'bad' value {v!r}")]


@contextlib.contextmanager
def config_with(overrides: tuple, key: str, value, present: bool):
    """The composed config of ``overrides`` with ``key`` set to ``value``, restored afterwards (a copy per value
    would cost more than the check itself)."""
    cfg = _compose(overrides)
    parent_key, _, last = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    before = OmegaConf.to_container(parent, resolve=False).get(last) if present else None
    with open_dict(cfg):
        OmegaConf.update(cfg, key, value, merge=False, force_add=not present)
    try:
        yield cfg
    finally:
        with open_dict(cfg):
            if present:
                OmegaConf.update(cfg, key, before, merge=False)
            else:
                del parent[last]


def assert_one_line_naming(key: str, value, overrides, present):
    with config_with(overrides, key, value, present) as cfg, pytest.raises(ConfigError) as info:
        check_config(cfg)
    msg = str(info.value)
    assert "\n" not in msg, msg
    assert msg.startswith(f"{key}="), f"{key}={value!r} reported as: {msg}"
    assert "allowed" in msg, msg
    return msg


CASES = cases()


def test_enough_keys_are_enumerated():
    keys = {c[1] for c in CASES}
    # a floor, so that enumeration going wrong (no configs composed) cannot pass silently
    assert len(CASES) >= 200 and len(keys) >= 120, (len(CASES), len(keys))
    for key in ("seed", "hardware.pipeline_parallel", "hardware.pcie_gbps", "model.num_kv_heads", "model.max_model_len",
                "latency.max_batch_size", "policy.watermark", "demand.scale", "memory.capacity_tokens",
                "predictor.sigma", "workload.rate_scale", "swap.efficiency", "engine.max_batch", "policy.slo.low"):
        assert key in keys, key


@pytest.mark.parametrize("overrides,key,spec,present", CASES, ids=[f"{c[1]}@{c[0][0]}" for c in CASES])
def test_every_bad_value_of_every_key_is_one_line_naming_it(overrides, key, spec, present):
    for value in bad_values(spec):
        assert_one_line_naming(key, value, overrides, present)


def test_the_schema_declares_every_key():
    """Every leaf of every shipped option (and experiment) has a declared type and bounds."""
    missing = set()
    for overrides in _option_overrides():
        plain = OmegaConf.to_container(_compose(tuple(overrides)), resolve=True)
        for name, node in _groups_of(plain):
            keys, known = SCHEMA[name].keys_for(node)
            assert known, f"{name} option {node.get(SCHEMA[name].by)} of {overrides} is not in kvstudy/config/schema.py"
            for key, _ in _leaves(node, keys):
                if not key.rsplit(".", 1)[-1].startswith("_") and key_spec(name, keys, key) is None:
                    missing.add(f"{name}.{key}" if name else key)
    assert not missing, f"keys without a declaration in kvstudy/config/schema.py: {sorted(missing)}"


def test_boundary_values_are_allowed():
    """The bounds are inclusive or exclusive as declared (no off-by-one refusing a legal value)."""
    for _, key, spec, _ in CASES:
        if spec.kind in ("whole", "number"):
            for bound in (spec.ge, spec.le):
                if bound is not None:
                    value = int(bound) if spec.kind == "whole" else float(bound)
                    if spec.power_of_two:
                        value = 1 << (int(value).bit_length() - 1) if value > 1 else 1
                    assert spec.valid(value), (key, value)


# --- Hypothesis: more of the same, drawn --------------------------------------------------------------------------
def _drawn_bad(spec: Key):
    """A strategy of values ``spec`` refuses."""
    if spec.kind in ("whole", "number"):
        low = spec.ge if spec.ge is not None else spec.gt
        high = spec.le if spec.le is not None else spec.lt
        parts = [st.text(min_size=1, max_size=8), st.sampled_from([INF, -INF, NAN]),
                 st.floats(min_value=float(high) * 2 + 1, max_value=1e300), st.booleans()]
        if low is not None:
            parts.append(st.floats(max_value=float(low) - 1, min_value=-1e300))
            if spec.kind == "whole":
                parts.append(st.integers(max_value=int(low) - 1, min_value=-2 ** 70))
        if spec.kind == "whole":
            parts.append(st.integers(min_value=int(high) + 1, max_value=2 ** 70))
            parts.append(st.floats(min_value=max(low or 0, 0) + 0.01, max_value=float(min(high, 2 ** 40))).filter(
                lambda v: not float(v).is_integer()))
        strategy = st.one_of(parts)
    elif spec.kind == "flag":
        strategy = st.one_of(st.integers(), st.floats(allow_nan=False), st.text())
    elif spec.kind == "choice":
        strategy = st.one_of(st.integers(), st.floats(allow_nan=False), st.text().filter(lambda t: t not in spec.choices))
    elif spec.kind == "text":
        strategy = st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans())
    elif spec.kind == "any":  # cluster.pools: anything but a mapping of pools (its module refuses it)
        return st.one_of(st.integers(), st.text(), st.booleans(), st.lists(st.integers(), min_size=1, max_size=3))
    else:
        strategy = st.one_of(st.integers(), st.text(), st.lists(_drawn_bad(spec.item), min_size=1, max_size=3))
    return strategy.filter(lambda v: not spec.valid(v) and v != "auto")


@settings(derandomize=True, max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_drawn_bad_values_are_one_line_naming_the_key(data):
    overrides, key, spec, present = data.draw(st.sampled_from(CASES), label="key")
    value = data.draw(_drawn_bad(spec), label="value")
    assert_one_line_naming(key, value, overrides, present)


# --- the kinds the trial of 287 bad inputs found, each through a real run ------------------------------------------
FAST = ["latency=linear", "engine.progress=false", "workload.num_requests=5"]


@pytest.mark.parametrize("override,match", [
    ("hardware.pipeline_parallel=0", r"^hardware.pipeline_parallel=0: allowed a whole number >= 1"),
    ("hardware.pipeline_parallel=3", r"^hardware.pipeline_parallel=3: does not divide model 'llama2_70b' num_layers=80"),
    ("hardware.pcie_gbps=0", r"^hardware.pcie_gbps=0: allowed a number > 0"),
    ("hardware.pcie_gbps=-31.5", r"^hardware.pcie_gbps=-31.5: allowed a number > 0"),
    ("hardware.memory_gb_per_gpu=-80", r"^hardware.memory_gb_per_gpu=-80: allowed a number > 0"),
    ("model.num_params=-1e9", r"^model.num_params=-1000000000.0: allowed a number > 0"),
    ("model.num_kv_heads=7", r"^model.num_kv_heads=7: does not divide model.num_q_heads=64"),
    ("model.max_model_len=1", r"^model.max_model_len=1: allowed a whole number >= 2"),
    ("hardware.tensor_parallel=2.5", r"^hardware.tensor_parallel=2.5: allowed a whole number"),
    ("hardware.tensor_parallel=3", r"^hardware.tensor_parallel=3: does not divide model 'llama2_70b'"),
    ("memory.capacity_tokens=true", r"^memory.capacity_tokens=true: allowed auto or a number"),
    ("seed=inf", r"^seed=inf: allowed a finite whole number"),
    ("seed=nan", r"^seed=nan: allowed a finite whole number"),
    ("demand.rate=inf", r"^demand.rate=inf: allowed a finite number > 0"),
    ("demand.rate=nan", r"^demand.rate=nan: allowed a finite number > 0"),
    ("memory.capacity_tokens=inf", r"^memory.capacity_tokens=inf: allowed auto or a finite whole number"),
    ("latency.d0=inf", r"^latency.d0=inf: allowed a finite number >= 0"),
    ("latency.d1=nan", r"^latency.d1=nan: allowed a finite number >= 0"),
    ("latency.d0=1e30", r"^latency.d0=1e\+30: allowed at most 1,000,000 seconds"),
    ("swap.per_layer_overhead_s=inf", r"^swap.per_layer_overhead_s=inf: allowed a finite number"),
    ("swap.efficiency=nan", r"^swap.efficiency=nan: allowed a finite number"),
    ("workload.num_requests=1e30", r"^workload.num_requests=1e\+30: allowed at most"),
])
def test_the_trials_bad_inputs_end_in_one_line(override, match):
    with pytest.raises(ConfigError, match=match) as info:
        api.simulate(api.compose(["+policy=mcsf", "+demand=high", *FAST, override]))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("overrides,match", [
    (["+policy=fcfs_watermark", "policy.watermark=1.5"], r"^policy.watermark=1.5: allowed a number >= 0 and < 1"),
    (["+policy=fcfs_watermark", "policy.watermark=nan"], r"^policy.watermark=nan: "),
    (["+policy=mcsf", "+demand=table1_rate", "workload=alpaca", "demand.scale=-2"],
     r"^demand.scale=-2: allowed a number > 0"),
    (["+policy=mcsf", "+demand=table1_rate", "workload=alpaca", "demand.scale=inf"], r"^demand.scale=inf: "),
    (["+policy=mcsf", "+demand=high", "latency=vidur", "latency.max_batch_size=0"],
     r"^latency.max_batch_size=0: allowed a whole number >= 1"),
    (["+policy=mcsf", "+demand=high", "latency=mcsf_authors", "latency.intercept_ms=inf"], r"^latency.intercept_ms=inf: "),
    (["+policy=mcsf", "+demand=high", "predictor=gaussian_noise", "predictor.low=10", "predictor.high=5"],
     r"^predictor.low=10: above predictor.high=5"),
    (["+policy=vllm", "+demand=high", "memory.swap_space_gb=-4"], r"^memory.swap_space_gb=-4: allowed a number >= 0"),
    (["+policy=mcsf", "+demand=high", "regime.arrivals=nope"], r"^regime.arrivals='nope': allowed paper, authors_code"),
])
def test_the_users_key_is_named_not_the_one_it_feeds(overrides, match):
    """policy.watermark used to be reported as policy.alpha, demand.scale as demand.rate, regime.arrivals as
    engine.arrivals (the key that interpolates it)."""
    with pytest.raises(ConfigError, match=match):
        api.simulate(api.compose(overrides + FAST[1:]))


def test_a_section_replaced_by_one_value_is_named():
    with pytest.raises(ConfigError, match=r"^engine=5: allowed the engine settings, set one by one"):
        api.simulate(api.compose(["+policy=mcsf", "+demand=high", *FAST, "engine=5"]))


def test_a_nested_section_replaced_by_one_value_is_named():
    sections = set()
    for overrides, key, _, present in CASES:
        parts = key.split(".")
        for i in range(2, len(parts)):
            if present:
                sections.add((overrides, ".".join(parts[:i])))
    assert {s for _, s in sections} >= {"policy.slo", "hardware.profiles", "workload.columns"}
    for overrides, section in sorted(sections):
        assert_one_line_naming(section, 5, overrides, True)


def test_model_len_too_small_for_requests_names_the_model_key():
    with pytest.raises(DataError, match=r"^model.max_model_len=3: fewer than 1 in 1,000"):
        api.simulate(api.compose(["+policy=mcsf", "+demand=high", *FAST, "workload.num_requests=20",
                                  "model.max_model_len=3"]))


def test_trace_token_counts_beyond_int32_name_file_row_and_column(tmp_path):
    path = tmp_path / "t.csv"
    pd.DataFrame({"prompt_tokens": [10, 1e30], "output_tokens": [3, 3], "arrival_time": [0, 1]}).to_csv(path, index=False)
    with pytest.raises(DataError, match=r"t.csv: column 'prompt_tokens' row 1 has value 1e\+30; allowed: whole numbers "
                                        r">= 1 and <= 2,147,483,648"):
        api.simulate(api.compose(["+policy=mcsf", "workload=trace", f"workload.path={path}", *FAST[:2]]))
    pd.DataFrame({"prompt_tokens": [10, 20], "output_tokens": [3, 2 ** 40], "arrival_time": [0, 1]}).to_csv(
        path, index=False)
    with pytest.raises(DataError, match=r"column 'output_tokens' row 1 has value 1099511627776"):
        api.simulate(api.compose(["+policy=mcsf", "workload=trace", f"workload.path={path}", *FAST[:2]]))


def test_a_bad_trace_row_is_the_files_row_even_after_a_drop(tmp_path):
    """Row 0's prompt exceeds the context and over_context=drop removes it: the bad value is still row 2 of the file
    (it used to be reported as row 1, its position after the drop)."""
    path = tmp_path / "t.csv"
    pd.DataFrame({"prompt_tokens": [5000, 10, 20], "output_tokens": [3, 3, -2], "arrival_time": [0, 1, 2]}).to_csv(
        path, index=False)
    with pytest.raises(DataError, match=r"column 'output_tokens' row 2 has value -2"):
        api.simulate(api.compose(["+policy=mcsf", "workload=trace", f"workload.path={path}", "workload.over_context=drop",
                                  *FAST[:2]]))


@pytest.mark.parametrize("workload", ["trace", "alpaca", "arena", "lmsys"])
def test_a_folder_as_workload_path_is_refused_before_opening(workload, tmp_path):
    overrides = ["+policy=mcsf", f"workload={workload}", f"workload.path={tmp_path}", *FAST[:2]]
    overrides += [] if workload == "trace" else ["+demand=high", "workload.num_requests=5"]
    with pytest.raises(DataError, match=rf"workload.path='{tmp_path}': a folder; allowed: a regular file"):
        api.simulate(api.compose(overrides))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_fifo_is_refused_without_opening_it(tmp_path):
    from kvstudy.workloads.requests import regular_file

    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="not a regular file"):
        regular_file(fifo)  # no open(): a broken guard fails here instead of hanging


@pytest.mark.parametrize("argv,match", [
    (["+policy=mcsf", "+policy=vllm"], r"^\+policy=vllm: policy is chosen twice \(first \+policy=mcsf\)"),
    (["+policy=mcsf", "+demand=high", "+demand=low"], r"^\+demand=low: demand is chosen twice"),
    (["+policy=mcsf", "seed=[1,"], r"^seed=\[1,: cannot be read"),
    (["+policy=mcsf", "policy.margin"], r"^policy.margin: cannot be read .*missing EQUAL"),
    (["+policy=mcsf", "+seed=3"], r"^\+seed=3: seed exists already; allowed: seed=3 \(to set it\), or \+\+seed=3"),
    (["+policy=mcsf", "~policy.nope"], r"^~policy.nope: no config has the key policy.nope"),
])
def test_command_line_shape_mistakes_are_one_line(argv, match):
    with pytest.raises(ConfigError, match=match) as info:
        check_overrides(argv)
    assert "\n" not in str(info.value)


# --- the real command lines ---------------------------------------------------------------------------------------
def cli(*args, module="kvstudy", timeout=60):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout)  # a hang fails here (TimeoutExpired) instead of stalling CI


def assert_one_error_line(proc, *names):
    err = proc.stderr.strip()
    assert proc.returncode != 0, proc.stdout[-1000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [ln for ln in err.splitlines() if not ln.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for name in names:
        assert name in lines[0], (name, lines[0])


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_cli_fifo_trace_is_one_line_not_a_hang(tmp_path):
    fifo = tmp_path / "trace.csv"
    os.mkfifo(fifo)
    proc = cli("+policy=mcsf", "workload=trace", f"workload.path={fifo}", "latency=unit", f"hydra.run.dir={tmp_path / 'r'}")
    assert_one_error_line(proc, "workload.path=", "not a regular file")


@pytest.mark.parametrize("args,names", [
    (["hardware.pcie_gbps=-1"], ["hardware.pcie_gbps=-1: allowed a number > 0"]),
    (["seed=nan"], ["seed=nan: allowed a finite whole number"]),
    (["+policy=vllm"], ["+policy=vllm: policy is chosen twice"]),
    (["seed=[1,"], ["seed=[1,: cannot be read"]),
])
def test_cli_bad_values_are_one_line(args, names, tmp_path):
    proc = cli("+policy=mcsf", "+demand=high", "latency=unit", "workload.num_requests=5", *args,
               f"hydra.run.dir={tmp_path}")
    assert_one_error_line(proc, *names)


@pytest.mark.parametrize("module,args,names", [
    ("kvstudy.latency", ["latency=unit", "model.num_kv_heads=7"], ["model.num_kv_heads=7: does not divide"]),
    ("kvstudy.latency", ["latency=linear", "latency.d0=inf"], ["latency.d0=inf: allowed a finite number"]),
    ("kvstudy.optimum", ["study", "--model", "1", "--trials", "abc"], ["--trials 'abc': allowed a whole number"]),
    ("kvstudy.optimum", ["study", "--model", "1", "--time-limit", "nan"], ["--time-limit nan: allowed a finite number"]),
    ("kvstudy.optimum", ["bound", "+policy=mcsf", "+demand=high", "workload.num_requests=5", "seed=-3"],
     ["seed=-3: allowed a whole number >= 0"]),
    ("kvstudy.profiles", ["build", "--models", "nope", "--out", "{tmp}"], ["unknown model 'nope'"]),
    ("kvstudy.profiles", ["calibrate", "--vidur-data", "{tmp}/missing", "--out", "{tmp}/c.json"],
     ["--vidur-data", "not a folder"]),
])
def test_other_commands_bad_arguments_are_one_line(module, args, names, tmp_path):
    proc = cli(*[a.replace("{tmp}", str(tmp_path)) for a in args], module=module)
    assert_one_error_line(proc, *names)
    assert not list(tmp_path.rglob("*.csv")) and not (tmp_path / "c.json").exists()  # nothing written


def test_the_shipped_configs_stay_valid_after_the_bad_values():
    """The configs are mutated in place and restored (config_with): every one still passes afterwards."""
    for overrides in {c[0] for c in CASES}:
        check_config(_compose(overrides))
