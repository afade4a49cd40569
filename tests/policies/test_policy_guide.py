"""docs/policies.md as a reader follows it: the files it shows written into a fresh home folder exactly as shown
(``<!-- file: PATH -->`` before a fenced block), the command lines it shows run exactly as shown
(``<!-- run -->`` before a bash block, one command per line, ``\\`` continuing a line; ``<!-- run: python -->`` before
a Python block), with HOME set to that folder; then each of its policies through the checks every built-in policy
gets (tests/policies/test_conformance.py)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvstudy import api
from kvstudy.engine import Engine
from kvstudy.latency.models import UnitLatency
from kvstudy.running.paths import REPO_ROOT
from kvstudy.policies.base import Policy
from kvstudy.policies.step import StepPolicy
from tests.step_helpers import step_engine
from tests.policies.test_conformance import assert_deterministic, instance, run

PAGE = REPO_ROOT / "docs" / "policies.md"
BLOCK = re.compile(r"^<!-- (?:file: (?P<path>\S+)|run(?P<python>: python)?) -->\n```[\w-]*\n(?P<body>.*?)^```",
                   re.M | re.S)


def page_blocks():
    """(kind, path, body) of each marked block, in page order: kind 'file', 'bash' or 'python'."""
    out = []
    for m in BLOCK.finditer(PAGE.read_text()):
        kind = "file" if m["path"] else ("python" if m["python"] else "bash")
        out.append((kind, m["path"], m["body"]))
    return out


def commands(body: str):
    """The commands of a bash block, each as written: a line ending in ``\\`` continues on the next; blank lines and
    comments are skipped."""
    out, current = [], ""
    for line in body.splitlines(keepends=True):
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line
        if not line.rstrip("\n").endswith("\\"):
            out.append(current.rstrip("\n"))
            current = ""
    return out + ([current] if current else [])


BLOCKS = page_blocks()
POLICY_YAMLS = {Path(path).stem: body for kind, path, body in BLOCKS if kind == "file" and "/policy/" in path}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A fresh home folder holding the page's files, and the environment its commands run in."""
    home = tmp_path_factory.mktemp("home")
    for kind, path, body in BLOCKS:
        if kind == "file":
            target = home / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(body)
    env = {**os.environ, "HOME": str(home),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)  # the page's commands set their own
    # The page assumes `pip install -e .` works from any folder. If this checkout's editable install points elsewhere
    # (a moved checkout), `python -m kvstudy` finds the package from the current folder instead: link it there.
    probe = subprocess.run([sys.executable, "-c", "import kvstudy, hydra_plugins.kvstudy_sweeps"], cwd=home, env=env,
                           capture_output=True)
    if probe.returncode:
        for name in ("kvstudy", "hydra_plugins"):
            (home / name).symlink_to(REPO_ROOT / name, target_is_directory=True)
    return home, env


def test_page_marks_both_examples():
    kinds = [kind for kind, _, _ in BLOCKS]
    assert kinds.count("file") >= 4 and "bash" in kinds and "python" in kinds
    assert len(POLICY_YAMLS) >= 2
    assert any("override /memory@_global_.memory: paged" in body for body in POLICY_YAMLS.values())


@pytest.mark.slow
def test_commands_run_as_written(home):
    """Every command line of the page, in page order, from the home folder: exit status 0 and the summary printed."""
    folder, env = home
    ran = 0
    for kind, _, body in BLOCKS:
        if kind == "bash":
            for line in commands(body):
                proc = subprocess.run(["bash", "-c", line], cwd=folder, env=env, capture_output=True, text=True,
                                      timeout=120)
                assert proc.returncode == 0, f"{line}\n{proc.stdout}\n{proc.stderr}"
                if " -m kvstudy -m " in line:  # a sweep: the launcher's count, one 'completed' line per run
                    runs = int(re.search(r"\[kvstudy launcher\] (\d+) runs", proc.stdout)[1])
                    assert len(re.findall(r"^#\d+ .*: completed, (\d+)/\1 requests", proc.stdout, re.M)) == runs, \
                        proc.stdout
                else:
                    assert re.search(r"^status\s+completed$", proc.stdout, re.M), proc.stdout
                    assert re.search(r"^requests completed\s+(\d+)/\1$", proc.stdout, re.M), proc.stdout
                    assert re.search(r"^outputs: ", proc.stdout, re.M), proc.stdout
                ran += 1
        elif kind == "python":
            proc = subprocess.run([sys.executable, "-c", body], cwd=folder, env=env, capture_output=True, text=True,
                                  timeout=120)
            assert proc.returncode == 0, f"{body}\n{proc.stdout}\n{proc.stderr}"
            for name in POLICY_YAMLS:
                assert name in proc.stdout, proc.stdout
            ran += 1
    assert ran >= 4


@pytest.fixture
def build(home, monkeypatch):
    """``build(name)``: the page's policy as ``+policy=name`` builds it, with the page's PYTHONPATH and search path."""
    folder, _ = home
    monkeypatch.syspath_prepend(str(folder / "my_policies"))
    return lambda name: api.build_policy(api.compose([f"hydra.searchpath=[file://{folder}/my_conf]",
                                                      f"+policy={name}"]))


def memories(policy):
    return ["paged"] if getattr(policy, "preemptive", False) else ["paper", "paged"]


@pytest.mark.parametrize("name", sorted(POLICY_YAMLS))
def test_conformance(name, build):
    """The checks of tests/policies/test_conformance.py on the page's policies: builds from its YAML with its name, finishes
    random small instances (all requests done, memory never exceeded), deterministic, picklable, no state kept
    between runs."""
    policy = build(name)
    assert isinstance(policy, (Policy, StepPolicy)) and policy.name == name
    for memory in memories(policy):
        for seed in range(3):
            res = run(build(name), instance(seed), memory=memory)
            assert res.status == "completed" and (res.requests["state"] == "done").all(), res.message
            assert (res.iterations.loc[~res.iterations["overflow"], "kv_tokens_in_use"] <= 80).all()
            if memory == "paged":
                assert (res.iterations["blocks_used"] <= 20).all()
        assert_deterministic(lambda: build(name), memory)


@pytest.mark.parametrize("name", sorted(POLICY_YAMLS))
def test_recovers_from_under_predictions(name, build):
    """Predictions of one token for every request: an admission-only policy over-commits and its ``on_overflow``
    must clear the way; a preemptive one must preempt. Both still finish every request."""
    req = instance(3)
    ones = np.ones(len(req), dtype=np.int64)
    policy = build(name)
    if not getattr(policy, "preemptive", False):
        policy.reset(0)
        res = Engine(req, ones, policy, UnitLatency(), 80, stall_limit=200).run()
        assert res.status == "completed" and res.clearing_events > 0, res.message
    res = step_engine(req, build(name), capacity=80, block_size=4, latency=UnitLatency(), stall_limit=200,
                      predicted=ones).run()
    assert res.status == "completed" and (res.requests["state"] == "done").all(), res.message
    assert res.requests["preemptions"].sum() > 0
