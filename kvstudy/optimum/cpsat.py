"""Better schedules (and, on small instances, proofs) from OR-Tools CP-SAT on a model of the IP (1)-(4).

The model has one integer start S_i in [a_i, latest_i] per request (``bounds.latest_starts`` of the schedule
it starts from, so no schedule at least as good is cut off). Memory (3) is written in one of two exact ways
(``formulation``), or both at once:
- "cumulative" (the default; what the stored studies ran): the growing footprint s + t - S in rounds
  S+1 .. S+o (``checker.py``'s convention) as stacked intervals under one cumulative constraint of capacity M:
  demand s over rounds S+1 .. S+o, plus demand 1 over rounds S+k .. S+o for k = 1 .. o; in round t their sum
  is s + (t - S).
- "completion": memory is checked only in the rounds where it can peak, the completion rounds S_i + o_i
  (``_completion_rows``), with one "is j active when i completes" choice per pair of requests.
``bench/cpsat_formulations.py`` compares them (numbers in docs/optimum.md). Two valid additions that cut off no
feasible schedule: the heavy blocks of ``bounds.heavy_blocks`` never overlap (a NoOverlap constraint, the same
fact as ``ip.block_rows``), and identical requests start in index order (``ip.twin_rows``). The objective is
(1), sum(S + o - a). The given schedule is the search hint.

Why CP-SAT: its large-neighbourhood subsolvers find much better schedules than ``lns.py`` on the smaller
Arrival Model 2 draws (Sec. 5.1). Measured on the 24 draws with n <= 30 after ``lns.improve`` (window 5,
2 passes), in docs/optimum.md. Its lower bound is weak; proofs at paper sizes come, when at all, from ``ip.py``.

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
FORMULATIONS = ("cumulative", "completion", "both")
DEFAULT_FORMULATION = "cumulative"  # what the stored studies ran; see the module text
# A child that crashed (segmentation fault, bus error) is run once more: the search is deterministic, so a
# finished second run gives exactly the result the first would have. Seen once in a 200-trial study, while a test
# run shared the machine (trial 190 of model2_n30_cpsat20_rerun.parquet); alone the same trial ran cleanly twice.
# A child killed (SIGKILL, e.g. by the out-of-memory killer) is not retried: a second run would meet the same wall.
CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGBUS)
CRASH_RETRIES = 1


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


def improve(inst: Instance, start, work: float, seed: int = 0, wall_limit: float | None = None,
            formulation: str = DEFAULT_FORMULATION) -> CPResult:
    """Search from the feasible schedule ``start`` for ``work`` deterministic-time units; see the module text.
    ``wall_limit`` (default 60 + 20 * work s) stops a child that runs away; that is an error, not a result.
    ``formulation``: memory (3) as the cumulative constraint, as the completion-round rows, or both."""
    if formulation not in FORMULATIONS:
        raise ConfigError(f"cpsat formulation {formulation!r}: allowed {', '.join(FORMULATIONS)}")
    require(work)
    start = np.asarray(start, dtype=np.int64)
    initial = check(inst, start)
    heavy, tail, beta = heavy_blocks(inst.prompt, inst.output, inst.capacity)
    latest = np.minimum(latest_starts(inst, initial), inst.horizon() - inst.output)
    payload = {"arrival": inst.arrival.tolist(), "prompt": inst.prompt.tolist(), "output": inst.output.tolist(),
               "capacity": int(inst.capacity), "latest": latest.tolist(), "hint": start.tolist(),
               "heavy": heavy.tolist(), "tail": tail.tolist(), "beta": beta.tolist(), "twins": twins(inst),
               "work": float(work), "seed": int(seed), "parent": os.getpid(), "formulation": formulation}
    began = time.perf_counter()
    limit = wall_limit if wall_limit is not None else 60.0 + 20.0 * work
    for attempt in range(1 + CRASH_RETRIES):
        try:
            done = subprocess.run([sys.executable, "-m", "kvstudy.optimum.cpsat"], input=json.dumps(payload),
                                  capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            raise ConfigError(f"cpsat: the CP-SAT child ran past its wall limit of {limit:.0f} s "
                              f"(work {work})") from None
        if -done.returncode not in CRASH_SIGNALS:
            break
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        tries = f" on each of {attempt + 1} tries" if attempt else ""
        raise ConfigError(f"cpsat: the CP-SAT child failed (exit {done.returncode}){tries}: {last}")
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
    formulation = p.get("formulation", DEFAULT_FORMULATION)
    cumulative = formulation in ("cumulative", "both")
    intervals, demands, blocks = [], [], []
    for i in range(n):  # per request: its footprint's intervals (if cumulative), then its heavy block
        oi = int(o[i])
        if cumulative:
            intervals.append(m.new_fixed_size_interval_var(S[i] + 1, oi, f"prompt{i}"))
            demands.append(int(s[i]))
            for k in range(1, oi + 1):
                intervals.append(m.new_fixed_size_interval_var(S[i] + k, oi - k + 1, f"grow{i}_{k}"))
                demands.append(1)
        if p["heavy"][i]:
            tail, beta = int(p["tail"][i]), int(p["beta"][i])
            blocks.append(m.new_fixed_size_interval_var(S[i] + oi - tail + 1, tail + beta, f"block{i}"))
    if cumulative:
        m.add_cumulative(intervals, demands, int(p["capacity"]))
    m.add_no_overlap(blocks)
    if formulation in ("completion", "both"):
        _completion_rows(m, S, a, s, o, np.asarray(p["latest"], dtype=np.int64), int(p["capacity"]))
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


def _completion_rows(m, S, a, s, o, latest, capacity: int) -> None:
    """Memory (3) checked only where it can peak: in the completion round C_i = S_i + o_i of every request.

    Between two completion rounds no request leaves and every active one grows by a token per round, so memory
    never falls there; its maximum over the schedule is reached in some completion round. In round C_i request i
    holds s_i + o_i, and request j holds s_j + C_i - S_j if it is active then (S_j < C_i <= S_j + o_j), else
    nothing. So  s_i + o_i + sum_j mem_ij <= M  for every i is exactly (3). One Boolean per pair says which of
    "j starts at or after C_i", "j is active at C_i", "j has finished before C_i" holds; pairs whose domains
    (start in [a_j, latest_j]) leave j no way to be active at C_i get no variables."""
    n = len(S)
    for i in range(n):
        held = []
        c_i = S[i] + int(o[i])
        for j in range(n):
            if j == i:
                continue
            gap_lo, gap_hi = a[i] + o[i] - latest[j], latest[i] + o[i] - a[j]  # range of C_i - S_j
            if gap_hi < 1 or gap_lo > o[j]:
                continue  # j is never active at C_i
            active, before, after = m.new_bool_var(""), m.new_bool_var(""), m.new_bool_var("")
            m.add_exactly_one([active, before, after])
            m.add(c_i <= S[j]).only_enforce_if(before)
            m.add(c_i >= S[j] + int(o[j]) + 1).only_enforce_if(after)
            m.add(c_i >= S[j] + 1).only_enforce_if(active)
            m.add(c_i <= S[j] + int(o[j])).only_enforce_if(active)
            mem = m.new_int_var(0, int(s[j] + o[j]), "")
            m.add(mem == int(s[j]) + c_i - S[j]).only_enforce_if(active)
            m.add(mem == 0).only_enforce_if(~active)
            held.append(mem)
        m.add(int(s[i] + o[i]) + sum(held) <= capacity)


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
