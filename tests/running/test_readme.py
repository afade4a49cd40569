"""Every command the README shows runs as written, on a small size (issue 26 item 7).

The commands are read from the README itself (lines of its ``bash`` blocks, and inline code that starts with
``python``), so a command added to the README is tested without touching this file. Each is shrunk by rules
that only add or lower size settings (fewer requests, seeds or trials, a temporary output folder), never by
rewriting what it does; a command no rule knows fails the test, and the rule has to be written here.
"""
import os
import re
import shlex
import subprocess
import sys

import pytest

from kvstudy.running.paths import REPO_ROOT
from tests.small import SMALL

README = (REPO_ROOT / "README.md").read_text()
PYTHON_BLOCK = re.search(r"```python\n(.*?)```", README, re.S).group(1)


def readme_commands():
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            commands += [part.strip() for part in line.split("&&") if part.strip()]
    commands += re.findall(r"`(python [^`]+)`", README)
    seen = []
    for cmd in commands:
        if cmd not in seen:
            seen.append(cmd)
    return seen


COMMANDS = readme_commands()
#: set-up steps and interactive programs: the install is what CI itself does; the test command is this suite
NOT_RUN = ("pip install", "python -m pytest", "jupyter lab")


def small(cmd: str, tmp):
    """The command at a small size, or None when it is not run here (NOT_RUN)."""
    if cmd.startswith(NOT_RUN):
        return None
    args = shlex.split(cmd)
    if args[:2] == ["jupyter", "nbconvert"]:
        i = args.index("--output-dir")
        return args[:i + 1] + [str(tmp / "nb")] + args[i + 2:]
    assert args[:2] == ["python", "-m"], f"no rule for this README command: {cmd}"
    module, rest = args[2], args[3:]
    exe = [sys.executable, "-m", module]
    if module == "kvstudy":
        experiment = next((a.split("=", 1)[1] for a in rest if a.startswith("+experiment=")), None)
        if experiment:
            # the notebooks' small size, on one seed (the notebooks' two seeds run the same code twice)
            size = [o.split(",")[0] if o.startswith("seed=") else o for o in SMALL[experiment]]
            return exe + rest + [o for o in size if o.split("=")[0] not in {a.split("=")[0] for a in rest}] \
                + [f"hydra.sweep.dir={tmp / 'sweep'}"]
        if "--cfg" in rest:
            return exe + rest
        if "workload=trace" in rest:
            (tmp / "trace.csv").write_text("arrival_time,prompt_tokens,output_tokens\n0.0,12,30\n0.5,40,8\n1.2,7,55\n")
        size = [] if "workload=trace" in rest else ["workload.num_requests=40"]
        where = f"hydra.sweep.dir={tmp / 'sweep'}" if "-m" in rest else f"hydra.run.dir={tmp / 'run'}"
        return exe + rest + size + [where]
    if module == "kvstudy.reproduce":  # the whole of a paper takes minutes to an hour: its plan only
        return exe + rest + ([] if "--dry-run" in rest else ["--dry-run"])
    if module == "kvstudy.studies":
        return exe + rest + ["workload.num_requests=100", f"out={tmp / 'alpha'}"]
    if module == "kvstudy.optimum":
        out, i = [], 0
        while i < len(rest):
            if rest[i] in ("--trials", "--time-limit", "--lns"):  # --lns: one pass of the search, not two (~6 s less)
                out += [rest[i], "1"]
                i += 2
                continue
            out.append(rest[i])
            i += 1
        if out[0] == "study":
            out += ["--out", str(tmp / "study.parquet")]
        return exe + out
    if module == "kvstudy.preemption_cost":
        return exe + rest + [f"out={tmp / 'cost'}"]
    raise AssertionError(f"no rule for this README command: {cmd}")


def test_readme_lists_the_commands_this_test_knows():
    assert len(COMMANDS) >= 20, COMMANDS
    assert "python -m kvstudy +policy=mcsf +demand=high" in COMMANDS  # the main job of the first set-up command
    for cmd in COMMANDS:  # every sweep experiment the README shows has a small size here
        for name in re.findall(r"\+experiment=(\w+)", cmd):
            assert name in SMALL, f"{name}: add it to tests/small.py"


@pytest.mark.slow
@pytest.mark.parametrize("cmd", COMMANDS)
def test_readme_command_runs(cmd, tmp_path):
    args = small(cmd, tmp_path)
    if args is None:
        pytest.skip("a set-up step or an interactive program (CI runs the set-up itself)")
    env = {**os.environ, "KVSTUDY_RESULTS": str(tmp_path / "results")}
    # the README's paths are from the repository root (notebooks/...); kvstudy's outputs go to tmp_path
    cwd = REPO_ROOT if args[0] == "jupyter" else tmp_path
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, f"{cmd}\n{' '.join(args)}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_readme_python_block_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(PYTHON_BLOCK, "README.md", "exec"), {})
    assert (tmp_path / "outputs" / "my_run" / "summary.json").exists()
