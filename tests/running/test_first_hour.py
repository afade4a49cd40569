"""What a new user hit in their first hour (issue 46): a run that rejected requests said ``completed`` and exited 0,
and the MC-SF paper's KV capacity stayed the default on other models and hardware without a word."""
import json
import subprocess
import sys
import warnings

import pytest

from kvstudy import api
from kvstudy.running.paths import REPO_ROOT

FAST = ["latency=linear", "workload.num_requests=20", "+demand=high", "engine.progress=false"]
# 20 LMSYS-like requests on a 256-token cache: some need more than the whole cache and are rejected up front
SMALL_CACHE = ["+policy=vllm", "memory.capacity_tokens=256"] + FAST


def test_a_run_that_rejected_requests_says_so():
    result, summary = api.simulate(api.compose(SMALL_CACHE))
    rejected = int((result.requests.state == "rejected").sum())
    assert rejected > 0 and summary["rejected"] == rejected
    assert summary["status"] == "some_rejected"
    assert f"{rejected} of 20 request(s) rejected" in summary["message"]
    assert "memory.capacity_tokens=auto" in summary["message"] and "engine.accept_rejections=true" in summary["message"]
    _, accepted = api.simulate(api.compose(SMALL_CACHE + ["engine.accept_rejections=true"]))
    assert accepted["status"] == "completed" and accepted["rejected"] == rejected


def test_the_command_line_exits_non_zero_on_rejections(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kvstudy", *SMALL_CACHE, f"hydra.run.dir={tmp_path / 'r'}"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3
    assert proc.stderr.strip().splitlines()[-1].startswith("error: run ended with status some_rejected: ")
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["status"] == "some_rejected"
    proc = subprocess.run([sys.executable, "-m", "kvstudy", *SMALL_CACHE, "engine.accept_rejections=true",
                           f"hydra.run.dir={tmp_path / 'a'}"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("overrides,warned", [
    (["model=llama32_1b", "hardware=a100_tp1"], True),  # another model and GPU at the paper's M: said
    (["model=llama32_1b", "hardware=a100_tp1", "memory.capacity_tokens=auto"], False),
    ([], False),  # the paper's own setting
])
def test_the_papers_capacity_on_other_hardware_is_named(overrides, warned):
    cfg = api.compose(["+policy=mcsf"] + FAST + overrides)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        api.simulate(cfg)
    notes = [str(w.message) for w in caught if "MC-SF paper's M" in str(w.message)]
    assert bool(notes) == warned
    if warned:
        assert notes[0].startswith("memory.capacity_tokens=16492 is the MC-SF paper's M for Llama2-70B on two A100s, "
                                   "not a capacity of model 'llama32_1b' on hardware 'a100_tp1'")


@pytest.mark.slow
def test_training_a_predictor_shows_its_progress(tmp_path, monkeypatch, capfd):
    """A cold build of Vidur's predictor (20-90 s) says what it is doing: a line per operator model trained and one
    for the attention tables, not one line and then silence (issue 46)."""
    monkeypatch.setenv("KVSTUDY_CACHE_DIR", str(tmp_path))
    api.simulate(api.compose(["+policy=vllm", "model=llama32_1b", "hardware=a100_tp1", "memory.capacity_tokens=4096",
                              "latency.max_tokens=4096", "workload.num_requests=5", "+demand=high",
                              "engine.progress=false"]))
    err = capfd.readouterr().err
    assert "training Vidur's predictor for llama32_1b on a100_tp1" in err
    assert err.count("  trained ") >= 10 and "  trained attn_decode (" in err
    assert "  predicting the attention tables" in err
