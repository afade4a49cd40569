"""``python -m kvstudy.reproduce``: the papers' experiment table, its commands, its errors, and one tiny run of the
whole path (a small sweep, skipped when run again, a notebook executed to HTML, a gallery figure)."""
import re
import shlex
import subprocess
import sys

import nbformat
import pytest
from omegaconf import OmegaConf

from kvstudy import api, reproduce
from kvstudy.running.paths import CONF_DIR, REPO_ROOT
from kvstudy.reproduce import PAPERS, Paper, Step
from kvstudy.config.validate import check_config

EXPERIMENTS = {p.stem for p in (CONF_DIR / "experiment").glob("*.yaml")}
ALL_STEPS = [(paper, step) for paper, p in PAPERS.items() for step in p.steps]


def _experiment(step):
    return next((a.split("=", 1)[1] for a in step.args if a.startswith("+experiment=")), None)


def test_every_experiment_named_exists_and_every_experiment_belongs_to_a_paper():
    named = {_experiment(s) for _, s in ALL_STEPS if s.sweep}
    assert None not in named
    assert named <= EXPERIMENTS, named - EXPERIMENTS
    assert named == EXPERIMENTS, f"experiments no paper runs: {EXPERIMENTS - named}"
    for paper, p in PAPERS.items():
        assert p.steps and p.notebooks, paper
        for name in p.notebooks:
            assert (REPO_ROOT / "notebooks" / name).exists(), name
        assert len({s.command() for s in p.steps}) == len(p.steps), f"{paper}: a command twice"
    notebooks = [n for p in PAPERS.values() for n in p.notebooks]
    assert sorted(notebooks) == sorted(p.name for p in (REPO_ROOT / "notebooks").glob("*.ipynb"))
    assert 10 <= sum(len(p.gallery) for p in PAPERS.values()) <= 16


def test_the_readmes_experiment_commands_are_in_the_table():
    readme = (REPO_ROOT / "README.md").read_text()
    commands = {s.command() for _, s in ALL_STEPS}
    shown = set(re.findall(r"`(python -m kvstudy \+experiment=[^`]+)`", readme))
    assert shown
    assert shown <= commands, shown - commands


@pytest.mark.parametrize("paper, step", [(p, s) for p, s in ALL_STEPS if s.hydra],
                         ids=[f"{p}:{' '.join(s.args)}" for p, s in ALL_STEPS if s.hydra])
def test_every_command_composes(paper, step):
    """Each sweep or search, with the first value of each swept list, is a valid config."""
    overrides = [a.split(",")[0] for a in step.args if "=" in a and not a.startswith("out=")]
    name = _experiment(step)
    if name:
        params = OmegaConf.load(CONF_DIR / "experiment" / f"{name}.yaml").hydra.sweeper.params
        given = {a.split("=")[0] for a in overrides}
        overrides += [f"{k}={str(v).split(',')[0]}" for k, v in params.items() if k.startswith("+") and k not in given]
    else:
        overrides = ["+policy=alpha_greedy"] + overrides
    cfg = api.compose(overrides)
    check_config(cfg)
    assert cfg.engine.progress is False or not name


def test_dry_run_prints_every_command(capsys):
    assert reproduce.main(["all", "--dry-run", "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    for _, step in ALL_STEPS:
        extra = " hydra.launcher.n_jobs=2" if step.sweep else (" --jobs 2" if step.module in ("kvstudy.optimum", "kvstudy.search") else "")
        assert step.command() + extra + "\n" in out, step.command()
    assert "notebooks/04_cacheopt.ipynb -> outputs/reproduce/cacheopt/04_cacheopt.html" in out


def test_overrides_replace_the_commands_own_key(capsys, monkeypatch):
    # the command lines only: the values' pre-check composes every run of the paper's 25 experiments (~20 s); it has
    # its own tests (tests/config/test_campaign54_inputs.py)
    from kvstudy.running import precheck

    monkeypatch.setattr(precheck, "check_runs", lambda argv, sweep=True: 1)
    assert reproduce.main(["mcsf", "--dry-run", "--", "hardware=a100_vidur_default"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("python -m kvstudy +experiment=table1 ")]
    # kvstudy's default and the a100_vidur_default line become one; the authors' regime keeps its own
    assert lines == ["python -m kvstudy +experiment=table1 hardware=a100_vidur_default",
                     "python -m kvstudy +experiment=table1 regime=authors hardware=a100_vidur_default"]


def test_the_cacheopt_script_runs_the_module():
    proc = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "cacheopt_study.sh"), "--dry-run"], capture_output=True,
                          text=True, cwd=REPO_ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("python -m kvstudy +experiment=cacheopt_") == 20


@pytest.mark.parametrize("args, says", [(["nope"], "unknown paper 'nope'; allowed: mcsf, rr_sjf, cacheopt, prefix, cluster, hardware, disaggregation, search, offload, all"),
                                        (["mcsf", "--jobs", "0"], "--jobs 0"),
                                        (["mcsf", "--", "hardware"], "not a Hydra override")])
def test_bad_arguments_give_one_error_line_and_status_2(args, says):
    proc = subprocess.run([sys.executable, "-m", "kvstudy.reproduce", *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], proc.stderr


def test_missing_nbconvert_is_named_with_the_install_command(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(reproduce, "missing_notebook_packages", lambda: ["nbconvert"])
    assert reproduce.main(["rr_sjf"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == 'error: executing the notebooks needs nbconvert (not installed): pip install -e ".[notebooks]"'
    assert not (tmp_path / "outputs").exists()  # said before any experiment ran


# four runs of 30 requests; latency=linear: no predictor to train in the session's empty cache; resume=config: the
# second run skips the first one's runs even if kvstudy's code changes in between (resume=code would re-run them)
TINY_SWEEP = ("+experiment=rr_sjf_policies", "workload.num_requests=30", "memory.capacity_tokens=4000", "seed=0",
              "policy.preemption_mode=recompute", "latency=linear", "resume=config")
TINY_NOTEBOOK = """\
import os
from pathlib import Path
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from kvstudy import analysis
RESULTS = Path(os.environ["KVSTUDY_RESULTS"])
df = analysis.load_sweep(RESULTS / "rr_sjf" / "llama32_1b_l4_tp1" / "policies")
print(f"tiny: {len(df)} runs")
(RESULTS / "figures").mkdir(parents=True, exist_ok=True)
fig, ax = plt.subplots(figsize=(8, 4))
ax.bar(range(len(df)), df["ttft.mean"])
fig.savefig(RESULTS / "figures" / "tiny.png", dpi=110)
"""


@pytest.mark.slow
def test_a_tiny_paper_end_to_end(tmp_path, monkeypatch, capsys):
    nb_dir = tmp_path / "notebooks"
    nb_dir.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(TINY_NOTEBOOK)]
    nbformat.write(nb, nb_dir / "tiny.ipynb")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(reproduce, "NOTEBOOKS_DIR", nb_dir)
    monkeypatch.setattr(reproduce, "GALLERY_DIR", tmp_path / "gallery")
    monkeypatch.setitem(PAPERS, "tiny", Paper("a tiny paper", (Step("kvstudy", TINY_SWEEP, "four policies", 5),),
                                              ("tiny.ipynb",), ("figures/tiny.png",)))

    assert reproduce.main(["tiny", "--jobs", "1", "--gallery"]) == 0
    out = capsys.readouterr().out
    command = "python -m kvstudy " + " ".join(TINY_SWEEP) + " hydra.launcher.n_jobs=1"
    line = next(ln for ln in out.splitlines() if ln.startswith("[1/1] "))
    assert line.startswith(f"[1/1] {command}  ") and line.endswith(" s, 4 runs"), line
    html = work / "outputs" / "reproduce" / "tiny" / "tiny.html"
    assert "tiny: 4 runs" in html.read_text()
    assert (work / "outputs" / "reproduce" / "tiny" / "logs").is_dir()
    copied = tmp_path / "gallery" / "tiny.png"
    assert copied.exists() and copied.stat().st_size < (work / "outputs" / "figures" / "tiny.png").stat().st_size

    assert reproduce.main(["tiny", "--jobs", "1"]) == 0  # again: every run is skipped
    assert "4 runs (4 done before)" in capsys.readouterr().out

    html.unlink()
    assert reproduce.main(["tiny", "--figures-only"]) == 0  # the notebook only
    out = capsys.readouterr().out
    assert "[1/1]" not in out and html.exists()

    bad = Step("kvstudy", ("+experiment=no_such_experiment",), "nothing", 1)
    monkeypatch.setitem(PAPERS, "tiny", Paper("a tiny paper", (bad,), ("tiny.ipynb",)))
    assert reproduce.main(["tiny"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: experiment 1/1 of tiny (nothing) failed with status ")
    assert "python -m kvstudy +experiment=no_such_experiment (log: " in err[0]
    log = shlex.split(err[0].rsplit("(log: ", 1)[1].rstrip(")"))[0]
    assert "no_such_experiment" in open(log).read()
