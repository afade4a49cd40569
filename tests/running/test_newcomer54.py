"""Issue 54, "the first hour" (items 2-13): what a newcomer met in a fresh clone, each checked as a mechanism."""
import gc
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml

from kvstudy.errors import ConfigError
from kvstudy.running.paths import CONF_DIR, REPO_ROOT, SHARED_REFERENCE
from tests.conftest import needs_shared

DOCS = REPO_ROOT / "docs"


def cli(*args, cwd=REPO_ROOT, module="kvstudy", env=None):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


# 2. a submitit sweep names the folder its runs are in -----------------------------------------------------------------
def test_sweep_dir_is_the_run_folder_without_its_subdir():
    from kvstudy.running.sweep_launcher import sweep_dir_of

    run = "/w/outputs/multirun/20261128-213731/+demand=high,+policy=mcsf,seed=0"
    assert sweep_dir_of(run, "+demand=high,+policy=mcsf,seed=0") == Path("/w/outputs/multirun/20261128-213731")
    # a subdir of several parts (an override value with a slash, or a nested subdir setting)
    assert sweep_dir_of("/w/sweep/a/b=c/d", "a/b=c/d") == Path("/w/sweep")
    # what the job reported as hydra.sweep.dir plays no part: a later ${now:...} named another folder (the issue's)
    assert sweep_dir_of(run, "seed=0") == Path("/w/outputs/multirun/20261128-213731")


@pytest.mark.slow
def test_local_submitit_sweep_done_names_the_runs_folder(tmp_path):
    """No hydra.sweep.dir given: the default ``outputs/multirun/${now:...}``, resolved again in the launcher after the
    jobs ran (seconds later) named a folder that did not exist."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    proc = cli("-m", "+policy=mcsf", "+demand=high", "seed=0,1", "latency=unit", "workload.num_requests=30",
               "engine.progress=false", "hydra/launcher=local_submitit", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = re.findall(r"^#\d+ (.+?): completed", proc.stdout, re.M)
    done = re.search(r"^sweep done: .* in [0-9.]+ s: (.+)$", proc.stdout, re.M)
    assert len(runs) == 2 and done, proc.stdout
    sweep = tmp_path / done[1]
    assert sweep.is_dir() and not Path(done[1]).is_absolute(), done[1]  # printed relative to the current folder
    assert all((tmp_path / r).parent == sweep for r in runs), (runs, done[1])


# 3. docs/prefix_caching.md's first offload command is the study's setting, with its expected output -------------------
def test_offload_doc_first_command_is_the_studys_setting():
    study = yaml.safe_load((CONF_DIR / "experiment" / "offload_mooncake.yaml").read_text())
    page = (DOCS / "prefix_caching.md").read_text()
    section = page[page.index("## A KV offload tier behind the cache"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S)[1]
    first = block.split("python -m kvstudy.reproduce")[0]
    assert "+policy=vllm" in first and "memory=paged_offload" in first
    assert f"workload.num_requests={study['workload']['num_requests']}" in first
    assert f"workload.rate_scale={study['workload']['rate_scale']}" in first
    # its printed output follows: the study's requests all served, each tier's line
    expected = re.search(r"```text\n(.*?)```", section[section.index(block):], re.S)[1]
    n = study["workload"]["num_requests"]
    assert re.search(r"^status\s+completed$", expected, re.M)
    assert re.search(rf"^requests completed\s+{n}/{n}$", expected, re.M), expected
    assert re.search(r"^host tier\s+hit rate \S+% of tokens looked up; read", expected, re.M), expected
    assert re.search(r"^offload loads\s+[\d,]+ tokens in ", expected, re.M), expected


# 4. an offload run's printout: each tier's hit, blocks and bytes; the tokens loaded -----------------------------------
@needs_shared
def test_offload_run_prints_each_tier(tmp_path, capsys):
    from kvstudy import api
    from kvstudy.__main__ import _print_summary

    cfg = api.compose(["+policy=vllm", "memory=paged_offload", "workload=mooncake", "model=llama31_8b",
                       "hardware=a100_tp1", "latency=linear", "workload.num_requests=300",
                       "memory.capacity_tokens=20000", "memory.offload.host_gb=64", "memory.offload.disk_gb=100",
                       "engine.progress=false"])
    summary = api.run(cfg, str(tmp_path / "run"))
    capsys.readouterr()
    _print_summary(summary, str(tmp_path / "run"))
    out = capsys.readouterr().out
    offload = summary["offload"]
    assert offload["tiers"]["host"]["read_blocks"] > 0, offload  # the instance exercises the tier
    for name, t in offload["tiers"].items():
        line = re.search(rf"^{name} tier\s+hit rate (\S+)% of tokens looked up; read ([\d,]+) blocks \((\S+) GB\), "
                         rf"written ([\d,]+) \((\S+) GB\), ([\d,]+) held at the end$", out, re.M)
        assert line, out
        assert float(line[1]) == round(100 * t["hit_rate"], 1)
        number = lambda text: int(text.replace(",", ""))  # noqa: E731
        assert number(line[2]) == t["read_blocks"] and number(line[4]) == t["written_blocks"]
        assert float(line[3].replace(",", "")) == round(t["read_bytes"] / 1e9, 1)
        assert number(line[6]) == t["blocks"]
    loads = re.search(r"^offload loads\s+([\d,]+) tokens in ", out, re.M)
    assert loads and int(loads[1].replace(",", "")) == offload["loaded_tokens"] == \
        int(pd.read_parquet(tmp_path / "run" / "requests.parquet")["offload_loaded_tokens"].sum())
    assert "(GPU and offload tiers together)" in out


def test_no_offload_rows_without_tiers():
    from kvstudy.__main__ import _offload_rows

    assert _offload_rows(None) == [] and _offload_rows({}) == []


# 5. a key of another option: the option is named first ----------------------------------------------------------------
def test_offload_key_on_paged_names_paged_offload():
    from kvstudy.config.validate import check_overrides

    with pytest.raises(ConfigError) as err:
        check_overrides(["+policy=vllm", "+demand=high", "memory=paged", "memory.offload.host_gb=256"])
    # and only that option: +memory.offload.host_gb=256 on memory=paged fails on the tier's other settings
    assert str(err.value) == ("memory.offload.host_gb=256: memory 'paged' has no offload.host_gb in its config; "
                              "allowed: memory=paged_offload memory.offload.host_gb=256 (memory 'paged_offload' has "
                              "offload.host_gb)"), err.value
    # the first suggestion is accepted as it is written
    check_overrides(["+policy=vllm", "+demand=high", "memory=paged_offload", "memory.offload.host_gb=256"])


# 6. training a predictor leaves no file open --------------------------------------------------------------------------
def _resource_warnings(caught):
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


def test_predictor_pickles_are_written_and_read_with_the_file_closed(tmp_path):
    from sklearn.linear_model import LinearRegression

    from kvstudy.latency.vidur_adapter import OfflineLinearRegressionPredictor

    predictor = object.__new__(OfflineLinearRegressionPredictor)  # Vidur's two cache methods need only these two
    predictor._cache_dir, predictor._config = str(tmp_path), SimpleNamespace(no_cache=False)
    model = LinearRegression().fit(np.arange(6.0).reshape(3, 2), [1.0, 2.0, 3.0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        predictor._store_model_in_cache("attn_pre_proj", "abc", model)
        back = predictor._load_model_from_cache("attn_pre_proj", "abc")
        missing = predictor._load_model_from_cache("mlp_act", "abc")
        gc.collect()
    assert not _resource_warnings(caught), _resource_warnings(caught)
    assert (tmp_path / "predictors" / "abc" / "attn_pre_proj.pkl").exists() and missing is None
    assert np.allclose(back.coef_, model.coef_)


@pytest.mark.slow
def test_training_emits_no_resource_warning(tmp_path):
    """Vidur's training itself (the cheapest: linear regression, Llama-3.2-1B on one A100, small grids); stock Vidur
    0.0.26 leaves 12 pickle files unclosed here."""
    from kvstudy.latency import vidur_adapter
    from kvstudy.latency.models import profile_files
    from kvstudy.latency.tables import HardwareSpec, PredictorSettings
    from kvstudy.running.paths import load_model_arch

    arch, hw = load_model_arch("llama32_1b"), HardwareSpec("a100_tp1", "a100", "a100_pairwise_nvlink", 1)
    settings = PredictorSettings(estimator="linear_regression", polynomial_degree=(1,), k_fold_cv_splits=2,
                                 max_tokens=2048, max_prefill_chunk=256, max_batch_size=8, kv_granularity=256)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vidur_adapter.make_predictor(arch, hw, profile_files(arch, hw), settings, str(tmp_path))
        gc.collect()
    assert len(list((tmp_path / "predictors").rglob("*.pkl"))) >= 12  # it did train and cache its models
    assert not _resource_warnings(caught), _resource_warnings(caught)


# 7. docs/policies.md quotes the lines the three ways of a wrong policy key print --------------------------------------
def test_policy_guide_quotes_what_is_printed(tmp_path, monkeypatch):
    from kvstudy import api
    from kvstudy.config.validate import check_overrides
    page = (DOCS / "policies.md").read_text()
    # the page's files as tests/policies/test_policy_guide.py writes them (``<!-- file: PATH -->`` before a fenced block;
    # importing that module would import tests/policies/test_conformance.py, 18 s)
    for path, body in re.findall(r"^<!-- file: (\S+) -->\n```[\w-]*\n(.*?)^```", page, re.M | re.S):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path / "my_policies"))
    row = next(ln for ln in page.splitlines() if "policy.foo" in ln and "error:" in ln)
    quoted = re.findall(r"`(error: [^`]*)` \(`([^`]*)`", row)
    assert {form for _, form in quoted} == {"policy.foo=1", "+policy.foo=1", "foo: 1"}, row
    search = f"hydra.searchpath=[file://{tmp_path}/my_conf]"
    for line, form in quoted:
        if form == "foo: 1":  # a key in the policy's YAML, refused as the policy is built
            spf = tmp_path / "my_conf" / "policy" / "spf.yaml"
            spf.write_text(spf.read_text() + "foo: 1\n")
            with pytest.raises(ConfigError) as err:
                api.build_policy(api.compose([search, "+policy=spf"]))
        else:
            with pytest.raises(ConfigError) as err:
                check_overrides([search, "+policy=spf", "+demand=high", form])
        assert f"error: {err.value}" == line


# 8. reproduce --dry-run: the estimate says warm cache, and what a cold one adds ---------------------------------------
def test_dry_run_says_warm_cache_and_counts_the_predictors(capsys):
    from kvstudy import reproduce

    reproduce.dry_run(["offload", "mcsf"], None, [], False)
    heads = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("# ") and "experiments" in ln]
    assert len(heads) == 2 and not any("from scratch" in h for h in heads)
    assert all("with a warm predictor cache; a cold predictor cache first trains" in h for h in heads), heads
    assert "trains 1 predictor(s)" in heads[0] and "(llama31_8b on a100_tp1)" in heads[0]
    # MC-SF: the default setting and one A100 timing all layers train; regime=authors runs the authors' formula
    assert reproduce.predictor_pairs(reproduce.plan("mcsf")) == [("llama2_70b", "a100_tp2"),
                                                                 ("llama2_70b", "a100_vidur_default")]
    assert reproduce._chosen("kvstudy", ["+experiment=table1", "regime=authors"])["latency"] == ["mcsf_authors"]
    assert reproduce._chosen("kvstudy", ["+experiment=hardware"])["hardware"] == ["a100_tp2", "h100_tp2", "h200_tp2",
                                                                                 "a40_tp4"]
    # an override after -- counts too
    steps = reproduce.plan("offload", overrides=["hardware=h100_tp1"])
    assert reproduce.predictor_pairs(steps) == [("llama31_8b", "h100_tp1")]


# 9. the offload study's span of the trace, computed -------------------------------------------------------------------
@needs_shared
def test_offload_study_span_is_the_traces():
    study = yaml.safe_load((CONF_DIR / "experiment" / "offload_mooncake.yaml").read_text())
    workload = yaml.safe_load((CONF_DIR / "workload" / "mooncake.yaml").read_text())
    n = study["workload"]["num_requests"]
    path = SHARED_REFERENCE / "traces-extra" / "mooncake" / "conversation_trace.jsonl"
    with open(path) as fh:
        stamps = [json.loads(line)["timestamp"] for _, line in zip(range(n), fh)]
    assert workload["time_unit"] == "ms"
    span = (stamps[-1] - stamps[0]) / 1000  # the first N requests' arrival span, in seconds
    minutes = f"{span:.0f} s ({span / 60:.2f} minutes)"
    yaml_text = " ".join((CONF_DIR / "experiment" / "offload_mooncake.yaml").read_text().replace("#", "").split())
    doc_text = " ".join((DOCS / "prefix_caching.md").read_text().split())
    assert f"first {n:,} requests (the first {minutes} of its hour" in yaml_text
    assert f"its first {n:,} requests: the first {minutes} of its hour" in doc_text
    assert not re.search(r"first [\d.]+ minutes", yaml_text + doc_text)  # no other figure of the span


# 10. timeline.memory: every line in the legend, the legend off the plot ----------------------------------------------
def test_memory_legend_labels_every_line_outside_the_plot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvstudy import timeline

    t = np.arange(50.0)
    it = pd.DataFrame({"start": t, "kv_tokens_in_use": 800 + 150 * np.sin(t / 4), "capacity": 1000,
                       "blocks_used": (800 + 150 * np.sin(t / 4)) // 16, "overflow": t % 17 == 3})
    ax = timeline.memory(SimpleNamespace(iterations=it))
    legend = ax.get_legend()
    labels = [text.get_text() for text in legend.get_texts()]
    assert labels == ["KV tokens in use", "capacity (tokens)", "clearing event", "blocks used"]
    drawn = [ln.get_label() for a in ax.figure.axes for ln in a.get_lines() if not ln.get_label().startswith("_")]
    assert sorted(drawn) == sorted(labels)  # every line labelled, each once
    ax.figure.canvas.draw()
    box, plot = legend.get_window_extent(), ax.get_window_extent()
    assert box.y0 >= plot.y1 - 1, (box, plot)  # above the axes: it covers no data
    plt.close(ax.figure)


# 11. --help: usage, +policy= required, every group with its options ---------------------------------------------------
def test_help_says_what_is_required_and_lists_the_groups():
    proc = cli("--help")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("usage: python -m kvstudy +policy=NAME")
    assert "+policy=NAME is required" in out and "is powered by Hydra" not in out
    assert len(out.splitlines()) < 40, len(out.splitlines())
    for group in sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra"):
        options = ", ".join(sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))
        assert f"\n{group}: {options}\n" in out, group
    defaults = yaml.safe_load((CONF_DIR / "config.yaml").read_text())["defaults"]
    for entry in defaults:
        if isinstance(entry, dict) and not any(str(k).startswith("override") for k in entry):
            (group, option), = entry.items()
            assert f"{group}={option}" in out, group


# 12. notebook 08 without results trains nothing -----------------------------------------------------------------------
def test_notebook_08_without_results_trains_nothing(tmp_path, monkeypatch, capsys):
    import matplotlib
    matplotlib.use("Agg")
    import nbformat

    monkeypatch.setenv("KVSTUDY_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("KVSTUDY_CACHE_DIR", str(tmp_path / "cache"))
    nb = nbformat.read(REPO_ROOT / "notebooks" / "08_offload.ipynb", as_version=4)
    scope = {"display": print}
    for cell in nb.cells:
        if cell.cell_type == "code":
            exec(compile(cell.source, "08_offload", "exec"), scope)
    out = capsys.readouterr().out
    assert "the break-even figure uses the study's predictor" in out
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("tables.npz"))
    # with results, the cell takes the model, hardware and KV capacity from the study's runs (the same cache key)
    source = next(c.source for c in nb.cells if "breakeven" in c.source)
    assert 'int(study["capacity_tokens"])' in source and "131072" not in source


# 13. the run prints its folder as the README does ---------------------------------------------------------------------
def test_shown_path_is_relative_inside_the_current_folder(tmp_path, monkeypatch):
    from kvstudy.running.paths import shown_path

    monkeypatch.chdir(tmp_path)
    assert shown_path(tmp_path / "outputs" / "runs" / "x") == os.path.join("outputs", "runs", "x")
    assert shown_path("outputs/runs/x") == os.path.join("outputs", "runs", "x")
    assert shown_path("/elsewhere/run") == "/elsewhere/run"


def test_readme_outputs_line_is_what_the_run_prints(tmp_path):
    readme = (REPO_ROOT / "README.md").read_text()
    line = re.search(r"^outputs: (\S+)$", readme, re.M)[1]
    pattern = re.escape(line).replace(re.escape("<time>"), r"\S+")
    proc = cli("+policy=mcsf", "+demand=high", "latency=unit", "workload.num_requests=20", "engine.progress=false",
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = re.search(r"^outputs: (.+)$", proc.stdout, re.M)[1]
    assert re.fullmatch(pattern, printed), (line, printed)
    assert (tmp_path / printed / "summary.json").exists()


# the new-user trial: Ctrl-C while the command line is still being checked or composed ---------------------------------
def test_ctrl_c_before_the_run_is_one_line_and_130(monkeypatch, capsys):
    import kvstudy.__main__ as cli
    from kvstudy.config import validate

    def interrupt(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(validate, "check_overrides", interrupt)
    monkeypatch.setattr(sys, "argv", ["kvstudy", "+policy=mcsf"])
    with pytest.raises(SystemExit) as done:
        cli._cli()
    assert done.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: interrupted (Ctrl-C) while preparing the command; nothing was written"], err
