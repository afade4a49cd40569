"""Notebooks execute headless against small sweeps produced here (the CI small-volume variant), and
committed notebooks carry no outputs."""
import subprocess
import sys

import nbformat
import pytest

from kvstudy.running.paths import REPO_ROOT
from tests.small import AUTHORS_REGIME, FOLDER, PAPER_REGIME, SMALL

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))


def run(args, **kw):
    proc = subprocess.run([sys.executable, "-m", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, **kw)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


@pytest.fixture(scope="session")
def small_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    for name, overrides in SMALL.items():
        run(["kvstudy", f"+experiment={name}", *overrides, f"hydra.sweep.dir={root / FOLDER.get(name, name)}"])
    for name in PAPER_REGIME:
        run(["kvstudy", f"+experiment={name}", *SMALL[name], "hardware=a100_vidur_default",
             f"hydra.sweep.dir={root / name / 'a100_vidur_default'}"])
    for name in AUTHORS_REGIME:
        run(["kvstudy", f"+experiment={name}", *SMALL[name], "regime=authors",
             f"hydra.sweep.dir={root / name / 'authors'}"])
    for folder, setting in (("a100_tp2", "hardware=a100_tp2"), ("a100_vidur_default", "hardware=a100_vidur_default"),
                            ("authors", "regime=authors")):
        for demand in ("high", "low"):
            run(["kvstudy.studies", "alpha-search", f"+demand={demand}", "workload.num_requests=150", setting,
                 f"out={root / 'alpha_search' / folder}"])
    for model in (1, 2):
        run(["kvstudy.optimum", "study", "--model", str(model), "--trials", "2", "--time-limit", "1", "--lns", "1",
             "--out", str(root / "optimum" / f"model{model}.parquet")])
    cut = ["kvstudy.optimum", "study", "--model", "1", "--trials", "2", "--cut", "8", "--lns", "1"]
    run([*cut, "--time-limit", "5", "--solver", "branch", "--out", str(root / "optimum" / "model1_cut8.parquet")])
    run([*cut, "--time-limit", "0", "--lp", "--out", str(root / "optimum" / "model1_lp.parquet")])
    return root


def test_committed_notebooks_have_no_outputs():
    assert NOTEBOOKS
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{path.name} has outputs committed"


@pytest.mark.xdist_group("notebooks")  # one worker builds the small sweeps once
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path, small_results, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("KVSTUDY_RESULTS", str(small_results))
    monkeypatch.setenv("KVSTUDY_SCALE_N", "300")  # notebook 02: the at-scale bound on a smaller workload
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "no results at" not in text and "no " + str(small_results) not in text, text[:2000]
    assert any((small_results / "figures").glob("*.png"))
