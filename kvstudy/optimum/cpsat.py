"""Better schedules (and, on small instances, proofs) from OR-Tools CP-SAT on a cumulative model of (1)-(4).

The model has one integer start S_i in [a_i, latest_i] per request (``bounds.latest_starts`` of the schedule
it starts from, so no schedule at least as good is cut off). The growing footprint s + t - S in rounds
S+1 .. S+o (``checker.py``'s convention) is written exactly as stacked intervals under one cumulative constraint
of capacity M: demand s over rounds S+1 .. S+o, plus demand 1 over rounds S+k .. S+o for k = 1 .. o; in round
t their sum is s + (t - S). Two valid additions that cut off no feasible schedule: the heavy blocks of
``bounds.heavy_blocks`` never overlap (a NoOverlap constraint, the same fact as ``ip.block_rows``), and identical
requests start in index order (``ip.twin_rows``). The objective is (1), sum(S + o - a). The given schedule is
the search hint.

Why CP-SAT: its large-neighbourhood subsolvers find much better schedules than ``lns.py`` on the smaller
Arrival Model 2 draws (Sec. 5.1). Measured on the 24 draws with n <= 30 after ``lns.improve`` (window 5,
2 passes), in the README. Its lower bound is weak; proofs at paper sizes come, when at all, from ``ip.py``.

Determinism: CP-SAT runs with ``interleave_search`` (its subsolvers take turns in a fixed order), a fixed
``random_seed`` and a *deterministic* time budget (``max_deterministic_time``, CP-SAT's work units, about 2-8
wall seconds each here), so the same instance, schedule, budget and seed give the same result on any machine.

Why a child process: the ortools wheel links its own HiGHS, and importing it into a process that has imported
``highspy`` (or the reverse) fails with an undefined-symbol ImportError. ``improve`` runs the model in a fresh
interpreter (``python -m kvstudy.optimum.cpsat``, JSON on stdin and stdout) and checks the returned schedule with
``checker.check`` before using it.
"""
from __future__ import annotations

import ctypes
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

from kvstudy.errors import ConfigError
from kvstudy.optimum.bounds import heavy_blocks, latest_starts
from kvstudy.optimum.checker import check
from kvstudy.optimum.instance import Instance
from kvstudy.optimum.ip import twins

SUBSOLVERS = 4  # interleaved subsolvers; with 2 cores the interleaved run uses both


@dataclass
class CPResult:
    start: np.ndarray  # the best schedule known: CP-SAT's if better than the given one, else the given one
    objective: int
    initial: int
    bound: float  # CP-SAT's lower bound on (1) (valid: the model cuts off no schedule at least as good)
    status: str  # CP-SAT's status: optimal | feasible | unknown (no schedule found; the given one is kept)
    seconds: float  # wall seconds, child process included

    @property
    def proven_optimal(self) -> bool:
        return self.status == "optimal"


def available() -> bool:
    return importlib.util.find_spec("ortools") is not None


def require(work: float, what: str = "cpsat") -> None:
    """Refuse a work budget that is not positive and finite, and a missing OR-Tools (naming ``what`` needs it
    and how to install it): the checks ``improve`` makes, for a caller that wants them before a long loop."""
    if not (work > 0 and math.isfinite(work)):
        raise ConfigError(f"{what} work {work!r}: allowed a positive, finite deterministic time budget")
    if not available():
        raise ConfigError(f"{what} needs OR-Tools, which is not installed: pip install -e '.[cpsat]'")


def improve(inst: Instance, start, work: float, seed: int = 0, wall_limit: float | None = None) -> CPResult:
    """Search from the feasible schedule ``start`` for ``work`` deterministic-time units; see the module text.
    ``wall_limit`` (default 60 + 20 * work s) stops a child that runs away; that is an error, not a result."""
    require(work)
    start = np.asarray(start, dtype=np.int64)
    initial = check(inst, start)
    heavy, tail, beta = heavy_blocks(inst.prompt, inst.output, inst.capacity)
    latest = np.minimum(latest_starts(inst, initial), inst.horizon() - inst.output)
    payload = {"arrival": inst.arrival.tolist(), "prompt": inst.prompt.tolist(), "output": inst.output.tolist(),
               "capacity": int(inst.capacity), "latest": latest.tolist(), "hint": start.tolist(),
               "heavy": heavy.tolist(), "tail": tail.tolist(), "beta": beta.tolist(), "twins": twins(inst),
               "work": float(work), "seed": int(seed), "parent": os.getpid()}
    began = time.perf_counter()
    limit = wall_limit if wall_limit is not None else 60.0 + 20.0 * work
    try:
        done = subprocess.run([sys.executable, "-m", "kvstudy.optimum.cpsat"], input=json.dumps(payload),
                              capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"cpsat: the CP-SAT child ran past its wall limit of {limit:.0f} s (work {work})") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise ConfigError(f"cpsat: the CP-SAT child failed (exit {done.returncode}): {last}")
    reply = json.loads(done.stdout)
    seconds = time.perf_counter() - began
    if reply["status"] not in ("optimal", "feasible", "unknown"):  # the hint is feasible: anything else is a bug
        raise ConfigError(f"cpsat: CP-SAT reported {reply['status']!r} on a model its start schedule satisfies")
    best, objective = start, initial
    if reply["start"] is not None:
        found = np.asarray(reply["start"], dtype=np.int64)
        value = check(inst, found)  # never trust the child: an infeasible schedule raises here
        if value < objective:
            best, objective = found, value
    return CPResult(best, objective, initial, float(reply["bound"]), reply["status"], seconds)


def _solve(p: dict) -> dict:
    """The model of the module text, solved; runs in the child (imports ortools, never highspy)."""
    from ortools.sat.python import cp_model

    a, s, o = (np.asarray(p[k], dtype=np.int64) for k in ("arrival", "prompt", "output"))
    n = len(a)
    m = cp_model.CpModel()
    S = [m.new_int_var(int(a[i]), int(p["latest"][i]), f"S{i}") for i in range(n)]
    intervals, demands, blocks = [], [], []
    for i in range(n):
        oi = int(o[i])
        intervals.append(m.new_fixed_size_interval_var(S[i] + 1, oi, f"prompt{i}"))
        demands.append(int(s[i]))
        for k in range(1, oi + 1):
            intervals.append(m.new_fixed_size_interval_var(S[i] + k, oi - k + 1, f"grow{i}_{k}"))
            demands.append(1)
        if p["heavy"][i]:
            tail, beta = int(p["tail"][i]), int(p["beta"][i])
            blocks.append(m.new_fixed_size_interval_var(S[i] + oi - tail + 1, tail + beta, f"block{i}"))
    m.add_cumulative(intervals, demands, int(p["capacity"]))
    m.add_no_overlap(blocks)
    for i, j in p["twins"]:
        m.add(S[i] <= S[j])
    m.minimize(sum(S) + int(np.sum(o - a)))
    for i in range(n):
        m.add_hint(S[i], int(p["hint"][i]))
    solver = cp_model.CpSolver()
    solver.parameters.interleave_search = True
    solver.parameters.num_workers = SUBSOLVERS
    solver.parameters.max_deterministic_time = float(p["work"])
    solver.parameters.random_seed = int(p["seed"])
    status = solver.solve(m)
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    return {"status": "optimal" if status == cp_model.OPTIMAL else "feasible" if found else solver.status_name(status).lower(),
            "start": [int(solver.value(x)) for x in S] if found else None,
            "bound": float(solver.best_objective_bound)}


def _die_with_parent(parent: int) -> None:
    """Linux: have the kernel kill this child when the process that started it ends (prctl
    PR_SET_PDEATHSIG), so a study that is killed, or a worker that ``study`` terminates, leaves no CP-SAT search
    running on its own. If that process has already gone, exit now. Elsewhere a no-op."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the wall limit of improve() still ends a runaway child
        return
    if os.getppid() != parent:
        sys.exit(1)


def main() -> int:
    payload = json.load(sys.stdin)
    _die_with_parent(int(payload["parent"]))
    json.dump(_solve(payload), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
